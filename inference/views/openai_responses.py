"""``POST /v1/responses``: OpenAI's Responses API, for the clients that speak only it (the ``openai`` SDKs'
``responses``, OpenAI's Agents SDK, Codex), with a RigDash key as a bearer token. A request is one turn, as a chat
completion is (quotas, fair queue, board, usage, cancel): its body becomes the chat completion RigDash passes to any
rig, the way llama-server's own ``/v1/responses`` converts it (tools/server/server-chat.cpp
``server_chat_convert_responses_to_chatcmpl``), and the reply is answered as a ``response`` object, whole or as its
events. RigDash keeps no response state: ``previous_response_id`` is refused, as llama-server refuses it.

https://platform.openai.com/docs/api-reference/responses. What differs from OpenAI's and llama-server's answers is
in docs/openai.md ("OpenAI's Responses API").
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse

from inference.board import apikeys
from inference.models import Turn
from inference.views.openai import key_refused
from inference.views.openai import openai_error as error
from inference.views.openai_chat import (
    ENDED_STATUSES,
    Piece,
    Submitted,
    answered,
    authenticated_submit,
    listener_finish,
    tool_call_rest,
    turn_submit_for,
    usage_of,
    written,
)
from inference.views.openai_request import BadRequest, body_read, chat_request_parse
from inference.views.token_counts import CountRefused, count_answer
from inference.views.turn_listener import TurnListener, on_db_thread

# The Responses API's own fields: translated below, or dropped because a chat completion has no such thing (the
# response store, hosted tools' options, truncation), as llama-server's conversion leaves them to a parser that
# ignores them. Every other field goes on as the chat completion's (temperature, top_p, seed, llama.cpp's samplers).
OWN_FIELDS = frozenset({
    "input", "instructions", "previous_response_id", "conversation", "max_output_tokens", "reasoning", "text",
    "tools", "tool_choice", "store", "include", "truncation", "metadata", "service_tier", "background", "prompt",
    "prompt_cache_key", "safety_identifier", "max_tool_calls", "top_logprobs", "stream_options",
})  # fmt: skip
MESSAGE_ROLES = ("user", "system", "developer")


# Translation ------------------------------------------------------------------------------------------------


def _input_parts(content: list[Any], where: str) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = []
    for index, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text") and isinstance(part.get("text"), str):
            parts.append({"type": "text", "text": part["text"]})
        elif kind == "input_image" and isinstance(part.get("image_url"), str):
            parts.append({"type": "image_url", "image_url": {"url": part["image_url"]}})
        elif kind == "input_image":
            raise BadRequest(f"{where}.content[{index}]: an image needs its image_url (a URL or a data URL)", "input")
        elif kind == "input_file":
            raise BadRequest(f"{where}.content[{index}]: input_file is not supported", "input")
        else:
            raise BadRequest(f"{where}.content[{index}] must be input_text (with its text) or input_image", "input")
    return parts


def _assistant(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The assistant message an output item belongs to: the last one, where the last message is the assistant's
    (a reply's text, its tool calls and its reasoning are items of their own), else a new one."""
    if messages and messages[-1]["role"] == "assistant":
        return messages[-1]
    messages.append({"role": "assistant", "content": ""})
    return messages[-1]


def _item(item: Any, index: int, messages: list[dict[str, Any]]) -> None:
    where = f"input[{index}]"
    if not isinstance(item, dict):
        raise BadRequest(f"{where} must be an object", "input")
    kind, role, content = item.get("type"), item.get("role"), item.get("content")
    if role in MESSAGE_ROLES and kind in (None, "message"):
        if isinstance(content, str):
            messages.append({"role": role, "content": content})
        elif isinstance(content, list):
            messages.append({"role": role, "content": _input_parts(content, where)})
        else:
            raise BadRequest(f"{where}.content must be a string or a list of content parts", "input")
    elif role == "assistant" and kind in (None, "message"):
        if isinstance(content, list):
            text = "".join(p["text"] for p in _input_parts([p for p in content if isinstance(p, dict)
                                                            and p.get("type") != "refusal"], where))  # fmt: skip
        elif isinstance(content, str):
            text = content
        else:
            raise BadRequest(f"{where}.content must be a string or a list of output_text parts", "input")
        message = _assistant(messages)
        message["content"] = (message["content"] or "") + text
    elif kind == "function_call":
        if not all(isinstance(item.get(name), str) for name in ("call_id", "name", "arguments")):
            raise BadRequest(f"{where}: a function_call needs call_id, name and arguments (strings)", "input")
        call = {"id": item["call_id"], "type": "function",
                "function": {"name": item["name"], "arguments": item["arguments"]}}  # fmt: skip
        _assistant(messages).setdefault("tool_calls", []).append(call)
    elif kind == "function_call_output":
        output = item.get("output")
        if not isinstance(item.get("call_id"), str) or not isinstance(output, str | list):
            raise BadRequest(f"{where}: a function_call_output needs its call_id and output", "input")
        result = output if isinstance(output, str) else _input_parts(output, f"{where}.output")
        messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": result})
    elif kind == "reasoning":
        parts = [p for field in (content, item.get("summary")) if isinstance(field, list) for p in field]
        texts = [p.get("text") for p in parts if isinstance(p, dict)]
        if text := next((t for t in texts if isinstance(t, str) and t), ""):
            _assistant(messages)["reasoning_content"] = text
    else:
        raise BadRequest(f"{where}: not a message (role and content), function_call, function_call_output or "
                         "reasoning item", "input")  # fmt: skip


def _tools(body: dict[str, Any]) -> dict[str, Any]:
    """Function tools as a chat completion's; a hosted tool (web search, file search...) has no equivalent on a rig
    and is left out, as llama-server leaves it out."""
    fields: dict[str, Any] = {}
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
            raise BadRequest("tools must be a list of objects", "tools")
        functions = [{"type": "function", "function": {k: v for k, v in t.items() if k != "type"}}
                     for t in tools if t.get("type") == "function"]  # fmt: skip
        if functions:
            fields["tools"] = functions
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        fields["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    elif choice is not None:
        fields["tool_choice"] = choice  # "auto", "none", "required"; another shape is the backend's to refuse
    return fields


def _format(body: dict[str, Any]) -> dict[str, Any]:
    """``text.format`` as a chat completion's ``response_format`` (llama-server's own conversion drops it)."""
    text = body.get("text")
    if text is None:
        return {}
    shape = text.get("format") if isinstance(text, dict) else None
    kind = shape.get("type") if isinstance(shape, dict) else None
    if shape is None or kind == "text":
        return {}
    if kind == "json_object":
        return {"response_format": {"type": "json_object"}}
    if kind == "json_schema" and isinstance(shape, dict) and isinstance(shape.get("schema"), dict):
        schema = {name: shape[name] for name in ("name", "schema", "strict", "description") if name in shape}
        return {"response_format": {"type": "json_schema", "json_schema": schema}}
    raise BadRequest("text.format must be text, json_object, or json_schema with its schema", "text")


def chat_body(body: dict[str, Any]) -> dict[str, Any]:
    """A Responses body as the chat completion RigDash submits (pure); BadRequest says what is wrong with it."""
    if "input" not in body:
        raise BadRequest("input is required", "input")
    for name in ("previous_response_id", "conversation"):
        if body.get(name):
            raise BadRequest(f"{name} is not supported: RigDash keeps no responses. Send the whole conversation "
                             "as input.", name)  # fmt: skip
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise BadRequest("instructions must be a string", "instructions")
        messages.append({"role": "system", "content": instructions})
    given = body["input"]
    if isinstance(given, str):
        messages.append({"role": "user", "content": given})
    elif isinstance(given, list) and given:
        for index, item in enumerate(given):
            _item(item, index, messages)
    else:
        raise BadRequest("input must be a string or a non-empty list of items", "input")
    chat = {name: value for name, value in body.items() if name not in OWN_FIELDS}
    chat.update(messages=messages, **_tools(body), **_format(body))
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    reasoning = body.get("reasoning")
    if isinstance(reasoning, dict) and reasoning.get("effort") is not None:
        chat["reasoning_effort"] = reasoning["effort"]
    return chat


def _submit(request: HttpRequest) -> Submitted:
    try:
        chat = chat_body(body_read(request.body))
        parsed = chat_request_parse(json.dumps(chat, ensure_ascii=False).encode())
    except BadRequest as exc:
        return error(exc.status, exc.message, param=exc.param, code=exc.error_code)
    return turn_submit_for(request, parsed)


# Answers ----------------------------------------------------------------------------------------------------


def _ids(turn: Turn) -> dict[str, str]:
    return {"response": f"resp_rd{turn.pk}", "message": f"msg_rd{turn.pk}", "reasoning": f"rs_rd{turn.pk}"}


def _call_item(call: dict[str, Any], status: str = "completed") -> dict[str, Any]:
    function = call.get("function") or {}
    call_id = str(call.get("id") or "")
    return {"type": "function_call", "id": f"fc_{call_id}", "call_id": call_id, "name": function.get("name") or "",
            "arguments": function.get("arguments") or "", "status": status}  # fmt: skip


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _output(turn: Turn) -> list[dict[str, Any]]:
    """The reply's output items: its reasoning, its text, then each tool call, as llama-server orders them."""
    ids, items = _ids(turn), []
    if turn.thinking_text:
        items.append({"type": "reasoning", "id": ids["reasoning"], "summary": [], "status": "completed",
                      "content": [{"type": "reasoning_text", "text": turn.thinking_text}]})  # fmt: skip
    if turn.reply_text:
        items.append({"type": "message", "id": ids["message"], "role": "assistant", "status": "completed",
                      "content": [_text_part(turn.reply_text)]})  # fmt: skip
    items += [_call_item(call) for call in (turn.stats or {}).get("tool_calls") or []]
    return items


def _usage(turn: Turn) -> dict[str, Any]:
    """The chat completion's usage (``usage_of``) under the Responses API's names."""
    chat = usage_of(turn)
    usage = {"input_tokens": chat["prompt_tokens"], "output_tokens": chat["completion_tokens"],
             "total_tokens": chat["total_tokens"]}  # fmt: skip
    if "prompt_tokens_details" in chat:
        usage["input_tokens_details"] = chat["prompt_tokens_details"]
    return usage


def _response(turn: Turn, model_id: str, *, status: str, output: list[dict[str, Any]] | None = None,
              ended: Turn | None = None) -> dict[str, Any]:  # fmt: skip
    """The ``response`` object: in progress (no output yet), or as the ended turn ``ended`` left it."""
    response: dict[str, Any] = {
        "id": _ids(turn)["response"], "object": "response", "created_at": int(turn.created_at.timestamp()),
        "status": status, "model": model_id, "output": output or [], "error": None, "incomplete_details": None,
        "previous_response_id": None, "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
    }  # fmt: skip
    if ended is None:
        return response
    if ended.finished_at is not None:
        response["completed_at"] = int(ended.finished_at.timestamp())
    if status == "incomplete":
        response["incomplete_details"] = {"reason": "max_output_tokens"}
    if status == "failed":
        response["error"] = {"code": "server_error", "message": ended.error or f"The reply was {ended.status}."}
    response["usage"] = _usage(ended)
    return response


def _status(turn: Turn) -> str:
    if turn.status in ENDED_STATUSES:
        return "failed"
    return "incomplete" if turn.finish_reason == "length" else "completed"


def _whole(turn: Turn, model_id: str) -> HttpResponse:
    return JsonResponse(_response(turn, model_id, status=_status(turn), output=_output(turn), ended=turn))


class _Events:
    """A streamed response's events, each with its ``sequence_number``, its items opened and closed in order: a
    reasoning item while thoughts come, a message while text comes, a function call per tool call (an item's
    ``output_index`` is its place in the output)."""

    def __init__(self, turn: Turn) -> None:
        self.ids = _ids(turn)
        self.sequence = 0
        self.output: list[dict[str, Any]] = []
        self.open: dict[str, Any] | None = None  # the item being streamed
        self.open_key: tuple[str, int] | None = None  # ("reasoning" or "message", -1), or ("call", its chat index)

    def event(self, kind: str, **data: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self.sequence, **data}
        self.sequence += 1
        return f"event: {kind}\ndata: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n".encode()

    def _start(self, key: tuple[str, int], item: dict[str, Any]) -> list[bytes]:
        events = self.close()
        self.open, self.open_key = item, key
        shown = {**item, "content": []} if "content" in item else item
        events.append(self.event("response.output_item.added", output_index=len(self.output), item=shown))
        if item["type"] == "message":
            events.append(self.event("response.content_part.added", item_id=item["id"], output_index=len(self.output),
                                     content_index=0, part=_text_part("")))  # fmt: skip
        return events

    def close(self) -> list[bytes]:
        item, self.open, self.open_key = self.open, None, None
        if item is None:
            return []
        index, events = len(self.output), []
        item["status"] = "completed"
        if item["type"] == "message":
            text = item["content"][0]["text"]
            events.append(self.event("response.output_text.done", item_id=item["id"], output_index=index,
                                     content_index=0, text=text, logprobs=[]))  # fmt: skip
            events.append(self.event("response.content_part.done", item_id=item["id"], output_index=index,
                                     content_index=0, part=item["content"][0]))  # fmt: skip
        elif item["type"] == "reasoning":
            events.append(self.event("response.reasoning_text.done", item_id=item["id"], output_index=index,
                                     content_index=0, text=item["content"][0]["text"]))  # fmt: skip
        else:
            events.append(self.event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                                     arguments=item["arguments"]))  # fmt: skip
        events.append(self.event("response.output_item.done", output_index=index, item=item))
        self.output.append(item)
        return events

    def text(self, text: str) -> list[bytes]:
        events = []
        if self.open_key != ("message", -1):
            events = self._start(("message", -1), {"type": "message", "id": self.ids["message"], "role": "assistant",
                                                   "status": "in_progress", "content": [_text_part("")]})  # fmt: skip
        assert self.open is not None
        self.open["content"][0]["text"] += text
        delta = self.event("response.output_text.delta", item_id=self.ids["message"], output_index=len(self.output),
                           content_index=0, delta=text, logprobs=[])  # fmt: skip
        return [*events, delta]

    def thinking(self, text: str) -> list[bytes]:
        events = []
        if self.open_key != ("reasoning", -1):
            events = self._start(("reasoning", -1), {"type": "reasoning", "id": self.ids["reasoning"], "summary": [],
                                                     "status": "in_progress",
                                                     "content": [{"type": "reasoning_text", "text": ""}]})  # fmt: skip
        assert self.open is not None
        self.open["content"][0]["text"] += text
        return [*events, self.event("response.reasoning_text.delta", item_id=self.ids["reasoning"],
                                    output_index=len(self.output), content_index=0, delta=text)]  # fmt: skip

    def tool(self, delta: dict[str, Any]) -> list[bytes]:
        """One chat tool-call delta: a call's first (its id and name) opens its item."""
        index = delta["index"] if isinstance(delta.get("index"), int) else 0  # the backend's word, not trusted
        events = []
        if self.open_key != ("call", index):
            events = self._start(("call", index), {**_call_item(delta, status="in_progress"), "arguments": ""})
        assert self.open is not None
        if arguments := (delta.get("function") or {}).get("arguments"):
            self.open["arguments"] += arguments
            events.append(self.event("response.function_call_arguments.delta", item_id=self.open["id"],
                                     output_index=len(self.output), delta=arguments))  # fmt: skip
        return events


async def _stream(
    turn: Turn, model_id: str, _usage_asked: bool, listener: TurnListener, pieces: AsyncIterator[Piece], first: Piece
) -> AsyncIterator[bytes]:
    """The reply as the Responses API's events, as the channel layer brings it. Closing the iterator before the end
    (the client went away) cancels the turn."""
    ended: Turn | None = None
    events = _Events(turn)
    calls_sent: list[dict[str, Any]] = []
    try:
        started = _response(turn, model_id, status="in_progress")
        yield events.event("response.created", response=started)
        yield events.event("response.in_progress", response=started)
        async for out in written(first, pieces, events, calls_sent):
            if isinstance(out, Turn):
                ended = out
            else:
                yield out
        assert ended is not None
        for call in tool_call_rest(calls_sent, (ended.stats or {}).get("tool_calls") or []):
            for event in events.tool(call):
                yield event
        for event in events.close():
            yield event
        status = _status(ended)
        end = {"completed": "response.completed", "incomplete": "response.incomplete", "failed": "response.failed"}
        yield events.event(end[status], response=_response(turn, model_id, status=status, output=events.output,
                                                           ended=ended))  # fmt: skip
    finally:
        await asyncio.shield(listener_finish(listener, ended is None))


async def responses(request: HttpRequest) -> HttpResponse | StreamingHttpResponse:
    """Async, so that waiting for a reply holds no thread; the key check, the translation and the submit run in one
    hop to a database thread (``on_db_thread``)."""
    if request.method != "POST":
        return error(405, "Use POST.", code="method_not_allowed")
    submitted = await on_db_thread(authenticated_submit)(request, _submit)
    return await answered(submitted, _stream, _whole)


responses.csrf_exempt = True  # type: ignore[attr-defined]  # API keys only, never a session cookie


async def input_tokens(request: HttpRequest) -> HttpResponse:
    """``POST /v1/responses/input_tokens``: the request's prompt (instructions, input, tools) counted by the rig that
    would serve it, as ``{"object": "response.input_tokens", "input_tokens": n}`` (inference/views/token_counts.py)."""
    return await count_answer(request, authenticate=_key_read, translate=chat_body, refused=_count_refused,
                              answer=_count_object)  # fmt: skip


def _count_object(count: int) -> dict[str, Any]:
    return {"object": "response.input_tokens", "input_tokens": count}


def _key_read(request: HttpRequest) -> HttpResponse | None:
    """The bearer key, read from its row, as ``request.api_key``; else OpenAI's 401."""
    try:
        request.api_key = apikeys.api_key_authenticate(request.headers.get("Authorization", ""))  # type: ignore[attr-defined]
    except apikeys.KeyRejected as exc:
        return key_refused(exc)
    return None


def _count_refused(refusal: CountRefused) -> HttpResponse:
    kind = "server_error" if refusal.status >= 500 else "requests" if refusal.status == 429 else "invalid_request_error"
    shaped = error(refusal.status, refusal.message, code=refusal.code, param=refusal.param, kind=kind)
    if refusal.retry_after_s is not None:
        shaped["Retry-After"] = str(refusal.retry_after_s)
    return shaped


input_tokens.csrf_exempt = True  # type: ignore[attr-defined]  # API keys only, never a session cookie
