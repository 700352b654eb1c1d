"""``POST /v1/messages``: Anthropic's Messages API for clients that speak it (Anthropic's SDKs, coding agents), with a
RigDash key in ``x-api-key`` or as a bearer token. A request is one turn, as a chat completion is (quotas, fair queue,
board, usage, cancel): its body is translated into the OpenAI request RigDash passes to any rig, the way
llama-server's own ``/v1/messages`` does (tools/server/server-chat.cpp ``server_chat_convert_anthropic_to_oai``), and
the reply is answered as Anthropic's ``message``, whole or as its server-sent events.

https://docs.anthropic.com/en/api/messages and /en/api/messages-streaming. What differs from Anthropic's and
llama-server's answers is in docs/openai.md ("Anthropic's Messages API").
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse

from inference.board import apikeys
from inference.models import Turn
from inference.views.openai import error_words, key_authenticated
from inference.views.openai_chat import (
    ENDED_STATUSES,
    Piece,
    Submitted,
    answer_confirmed,
    answered,
    ended_error,
    listener_finish,
    tool_call_rest,
    turn_submit_for,
    written,
)
from inference.views.openai_request import BadRequest, body_read, chat_request_parse
from inference.views.token_counts import CountRefused, count_answer
from inference.views.turn_listener import TurnListener, on_db_thread

# Anthropic's error types by HTTP status (https://docs.anthropic.com/en/api/errors); any other 5xx is api_error.
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 405: "invalid_request_error", 409: "invalid_request_error",
               413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error"}  # fmt: skip
# Passed on under the same name (llama-server's conversion passes these; the OpenAI request takes them as they are).
SAME_NAME = ("temperature", "top_p", "top_k", "chat_template_kwargs")


def anthropic_error(status: int, message: str) -> JsonResponse:
    kind = ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return JsonResponse({"type": "error", "error": {"type": kind, "message": message}}, status=status)


def _anthropic_shape(response: HttpResponse) -> HttpResponse:
    """An OpenAI-shaped error answer in Anthropic's shape, same status (and ``Retry-After``)."""
    if (message := error_words(response)) is None:
        return response
    shaped = anthropic_error(response.status_code, message)
    if response.has_header("Retry-After"):
        shaped["Retry-After"] = response["Retry-After"]
    return shaped


def anthropic_authenticated(request: HttpRequest, *, remembered: bool = False) -> HttpResponse | None:
    """The key from ``x-api-key`` (Anthropic's SDKs) or ``Authorization: Bearer`` (an auth token), as
    ``request.api_key``; else the 401 in Anthropic's shape. ``remembered``: it may come from memory (``key_checked``),
    for a caller that confirms it before any answer (``_submit``)."""
    return key_authenticated(request, _key_refused, remembered=remembered)


def _key_refused(exc: apikeys.KeyRejected) -> HttpResponse:
    return anthropic_error(401, exc.message.replace("Authorization: Bearer", "x-api-key:"))


# Translation ------------------------------------------------------------------------------------------------


def _image_url(source: Any) -> str | None:
    if not isinstance(source, dict):
        return None
    if source.get("type") == "base64":
        return f"data:{source.get('media_type') or 'image/jpeg'};base64,{source.get('data') or ''}"
    if source.get("type") == "url":
        return str(source.get("url") or "")
    return None


def _blocks(content: list[Any], where: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]], str]:
    """A content block list as OpenAI's content parts, tool calls and reasoning text."""
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    reasoning = ""
    for index, block in enumerate(content):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise BadRequest(f"{where}.content[{index}] must be an object with a type")
        kind = block["type"]
        if kind == "text":
            if not isinstance(block.get("text"), str):
                raise BadRequest(f"{where}.content[{index}].text must be a string")
            parts.append({"type": "text", "text": block["text"]})
        elif kind == "thinking":
            reasoning += str(block.get("thinking") or "")
        elif kind == "image" and (url := _image_url(block.get("source"))) is not None:
            parts.append({"type": "image_url", "image_url": {"url": url}})
        elif kind == "tool_use":
            arguments = json.dumps(block.get("input") or {}, ensure_ascii=False)
            function = {"name": str(block.get("name") or ""), "arguments": arguments}
            calls.append({"id": str(block.get("id") or ""), "type": "function", "function": function})
    return parts, calls, reasoning


def _tool_result(block: dict[str, Any]) -> dict[str, Any]:
    """A ``tool_result`` block as OpenAI's tool message: its text, or content parts where it holds images."""
    content = block.get("content")
    if isinstance(content, list):
        parts, _, _ = _blocks([c for c in content if isinstance(c, dict)], "tool_result")
        content = parts if any(p["type"] != "text" for p in parts) else "".join(p["text"] for p in parts)
    elif not isinstance(content, str):
        content = ""
    return {"role": "tool", "tool_call_id": str(block.get("tool_use_id") or ""), "content": content}


BILLING_HEADER = "x-anthropic-billing-header:"
CCH_CHARS = 5


def _billing_header_fixed(text: str) -> str:
    """Claude Code's system prompt begins with a billing header whose ``cch=`` stamp changes on every request, so no
    prompt cache would reach past it: its five characters become ``fffff``, as llama-server's own ``/v1/messages``
    does (tools/server/server-chat.cpp ``normalize_anthropic_billing_header``). Any other text is left as it is."""
    if not text.startswith(BILLING_HEADER):
        return text
    at = text.find("cch=", len(BILLING_HEADER))
    if at < 0:
        return text
    start = at + len("cch=")
    if start + CCH_CHARS < len(text) and text[start + CCH_CHARS] == ";":
        return text[:start] + "f" * CCH_CHARS + text[start + CCH_CHARS :]
    return text


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    system = body.get("system")
    if isinstance(system, str) and system:
        out.append({"role": "system", "content": _billing_header_fixed(system)})
    elif isinstance(system, list) and system:
        text = "".join(_billing_header_fixed(str(b.get("text") or "")) for b in system
                       if isinstance(b, dict) and b.get("type") == "text")  # fmt: skip
        out.append({"role": "system", "content": text})
    elif system not in (None, "", []):
        raise BadRequest("system must be a string or a list of text blocks")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages: a non-empty list is required")
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
            raise BadRequest(f"{where} must be an object whose role is 'user' or 'assistant'")
        content = message.get("content")
        if isinstance(content, str):
            out.append({"role": message["role"], "content": content})
            continue
        if not isinstance(content, list):
            raise BadRequest(f"{where}.content must be a string or a list of content blocks")
        parts, calls, reasoning = _blocks(content, where)
        if parts or calls or reasoning:
            converted: dict[str, Any] = {"role": message["role"], "content": parts or ""}
            if calls:
                converted["tool_calls"] = calls
            if reasoning:
                converted["reasoning_content"] = reasoning
            out.append(converted)
        out += [_tool_result(b) for b in content if isinstance(b, dict) and b.get("type") == "tool_result"]
    return out


def _tools(body: dict[str, Any]) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
            raise BadRequest("tools must be a list of objects")
        fields["tools"] = [
            {"type": "function", "function": {"name": t.get("name"), "description": t.get("description") or "",
                                              "parameters": t.get("input_schema") or {}}}
            for t in tools
        ]  # fmt: skip
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        kind = choice.get("type")
        if kind in ("auto", "none"):
            fields["tool_choice"] = kind
        elif kind in ("any", "tool"):  # one named tool too: llama-server takes only OpenAI's strings
            fields["tool_choice"] = "required"
    elif choice is not None:
        raise BadRequest("tool_choice must be an object with a type")
    return fields


def openai_body(body: dict[str, Any]) -> dict[str, Any]:
    """An Anthropic Messages body as the OpenAI chat completion RigDash submits (pure); BadRequest says what is wrong
    with it. ``max_tokens`` goes on as the cap (Anthropic requires it; a request without one gets the owner's). A
    field not read here has no OpenAI equivalent and is dropped, as llama-server drops it (``metadata`` too)."""
    fields: dict[str, Any] = {"model": body.get("model"), "messages": _messages(body), **_tools(body)}
    if (stop := body.get("stop_sequences")) is not None:
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise BadRequest("stop_sequences must be a list of strings")
        fields["stop"] = stop
    if body.get("max_tokens") is not None:
        fields["max_tokens"] = body["max_tokens"]
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest("stream must be a boolean")
    fields["stream"] = stream
    fields |= {name: body[name] for name in SAME_NAME if body.get(name) is not None}
    thinking = body.get("thinking")
    if isinstance(thinking, dict) and thinking.get("type") == "enabled":
        fields["thinking_budget_tokens"] = thinking.get("budget_tokens", 10000)
    return fields


def _submit(request: HttpRequest) -> Submitted:
    if (refused := anthropic_authenticated(request, remembered=True)) is not None:
        return refused
    return answer_confirmed(request, _submit_parsed(request), _key_refused)


def _submit_parsed(request: HttpRequest) -> Submitted:
    try:
        body = body_read(request.body)
        parsed = chat_request_parse(json.dumps(openai_body(body), ensure_ascii=False).encode())
    except BadRequest as exc:
        return anthropic_error(exc.status, exc.message)
    submitted = turn_submit_for(request, parsed)
    return _anthropic_shape(submitted) if isinstance(submitted, HttpResponse) else submitted


# Answers ----------------------------------------------------------------------------------------------------


def _stop_reason(turn: Turn) -> str:
    """Anthropic's stop reason: ``stop_sequence`` where the backend said which of the request's sequences ended the
    reply (``_stop_sequence``), as Anthropic's API answers; llama-server's own ``/v1/messages`` says ``end_turn``."""
    if _stop_sequence(turn) is not None:
        return "stop_sequence"
    return {"length": "max_tokens", "tool_calls": "tool_use"}.get(turn.finish_reason, "end_turn")


def _stop_sequence(turn: Turn) -> str | None:
    """The stop sequence that ended the reply (inference/worker/stream.py keeps the backend's word), or None: no
    sequence matched, or the backend does not say which (Ollama)."""
    word = (turn.stats or {}).get("stop_sequence")
    return word if isinstance(word, str) and word and turn.finish_reason == "stop" else None


def _usage(turn: Turn) -> dict[str, int]:
    """Anthropic's split: the prompt tokens the server read, and those it had cached."""
    cached = int((turn.stats or {}).get("cached_tokens") or 0)
    prompt = turn.prompt_tokens or 0
    return {"input_tokens": max(prompt - cached, 0), "cache_read_input_tokens": cached,
            "output_tokens": turn.output_tokens or 0}  # fmt: skip


def _tool_input(arguments: str) -> Any:
    """A call's arguments as the object Anthropic's ``input`` is; arguments the model malformed are ``{}``, as in
    llama-server's own answer (the OpenAI API gives them as sent)."""
    try:
        value = json.loads(arguments or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _content(turn: Turn) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if turn.thinking_text:
        blocks.append({"type": "thinking", "thinking": turn.thinking_text, "signature": ""})
    if turn.reply_text:
        blocks.append({"type": "text", "text": turn.reply_text})
    for call in (turn.stats or {}).get("tool_calls") or []:
        function = call.get("function") or {}
        blocks.append({"type": "tool_use", "id": call.get("id") or "", "name": function.get("name") or "",
                       "input": _tool_input(function.get("arguments") or "")})  # fmt: skip
    return blocks


def _message(turn: Turn, model_id: str) -> dict[str, Any]:
    return {"id": f"msg_rd{turn.pk}", "type": "message", "role": "assistant", "model": model_id}


def _whole(turn: Turn, model_id: str) -> HttpResponse:
    return JsonResponse({**_message(turn, model_id), "content": _content(turn), "stop_reason": _stop_reason(turn),
                         "stop_sequence": _stop_sequence(turn), "usage": _usage(turn)})  # fmt: skip


def _refused(turn: Turn) -> HttpResponse | None:
    refused = ended_error(turn)
    return None if refused is None else _anthropic_shape(refused)


def _event(name: str, data: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data, ensure_ascii=False, separators=(',', ':'))}\n\n".encode()


class _Blocks:
    """The content blocks of a streamed reply: a thinking block while thoughts come, a text block while text comes, a
    tool_use block per call, each started and stopped in order (a block's index is its place in the message's
    content)."""

    def __init__(self) -> None:
        self.count = 0
        self.open: tuple[str, int] | None = None  # ("thinking" or "text", -1), or ("tool", the call's OpenAI index)

    def _start(self, key: tuple[str, int], block: dict[str, Any]) -> list[bytes]:
        events = self.stop()
        self.open = key
        events.append(_event("content_block_start",
                             {"type": "content_block_start", "index": self.count, "content_block": block}))  # fmt: skip
        return events

    def stop(self) -> list[bytes]:
        if self.open is None:
            return []
        # A thinking block ends with its signature, which a local model has none of (llama-server sends "" too).
        signed = [self._delta({"type": "signature_delta", "signature": ""})] if self.open[0] == "thinking" else []
        self.open = None
        self.count += 1
        return [*signed, _event("content_block_stop", {"type": "content_block_stop", "index": self.count - 1})]

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return _event("content_block_delta", {"type": "content_block_delta", "index": self.count, "delta": delta})

    def thinking(self, text: str) -> list[bytes]:
        opened = self.open == ("thinking", -1)
        events = [] if opened else self._start(("thinking", -1), {"type": "thinking", "thinking": "", "signature": ""})
        return [*events, self._delta({"type": "thinking_delta", "thinking": text})]

    def text(self, text: str) -> list[bytes]:
        events = [] if self.open == ("text", -1) else self._start(("text", -1), {"type": "text", "text": ""})
        return [*events, self._delta({"type": "text_delta", "text": text})]

    def tool(self, call: dict[str, Any]) -> list[bytes]:
        """One OpenAI tool-call delta: a call's first (its id and name) starts its block."""
        index = call["index"] if isinstance(call.get("index"), int) else 0  # the backend's word, not trusted
        function = call.get("function") or {}
        events: list[bytes] = []
        if self.open != ("tool", index):
            block: dict[str, Any] = {"type": "tool_use", "id": call.get("id") or "", "name": function.get("name") or "",
                                     "input": {}}  # fmt: skip
            events = self._start(("tool", index), block)
        if arguments := function.get("arguments"):
            events.append(self._delta({"type": "input_json_delta", "partial_json": arguments}))
        return events


async def _stream(
    turn: Turn, model_id: str, _usage_asked: bool, listener: TurnListener, pieces: AsyncIterator[Piece], first: Piece
) -> AsyncIterator[bytes]:
    """The reply as Anthropic's events, as the channel layer brings it. Closing the iterator before the end (the
    client went away) cancels the turn."""
    ended: Turn | None = None
    blocks = _Blocks()
    calls_sent: list[dict[str, Any]] = []
    try:
        start = {**_message(turn, model_id), "content": [], "stop_reason": None, "stop_sequence": None,
                 "usage": {"input_tokens": 0, "output_tokens": 0}}  # fmt: skip
        yield _event("message_start", {"type": "message_start", "message": start})
        async for out in written(first, pieces, blocks, calls_sent):
            if isinstance(out, Turn):
                ended = out
            else:
                yield out
        assert ended is not None
        if ended.status in ENDED_STATUSES:
            message = ended.error or f"The reply was {ended.status}."
            yield _event("error", {"type": "error", "error": {"type": "api_error", "message": message}})
            return
        for call in tool_call_rest(calls_sent, (ended.stats or {}).get("tool_calls") or []):
            for event in blocks.tool(call):
                yield event
        for event in blocks.stop():
            yield event
        end = {"stop_reason": _stop_reason(ended), "stop_sequence": _stop_sequence(ended)}
        yield _event("message_delta", {"type": "message_delta", "delta": end, "usage": _usage(ended)})
        yield _event("message_stop", {"type": "message_stop"})
    finally:
        await asyncio.shield(listener_finish(listener, ended is None))


# Token counting ---------------------------------------------------------------------------------------------


async def count_tokens(request: HttpRequest) -> HttpResponse:
    """``POST /v1/messages/count_tokens``: the request's prompt (system, messages, tools) counted by the rig that
    would serve it, as ``{"input_tokens": n}`` (inference/views/token_counts.py)."""
    return await count_answer(request, authenticate=anthropic_authenticated, translate=openai_body,
                              refused=_count_refused, answer=lambda count: {"input_tokens": count})  # fmt: skip


count_tokens.csrf_exempt = True  # type: ignore[attr-defined]  # API keys only, never a session cookie


def _count_refused(refusal: CountRefused) -> HttpResponse:
    shaped = anthropic_error(refusal.status, refusal.message)
    if refusal.retry_after_s is not None:
        shaped["Retry-After"] = str(refusal.retry_after_s)
    return shaped


async def messages(request: HttpRequest) -> HttpResponse | StreamingHttpResponse:
    """Async, so that waiting for a reply holds no thread; the key check, the translation and the submit run in one
    hop to a database thread (``on_db_thread``)."""
    if request.method != "POST":
        return anthropic_error(405, "Use POST.")
    submitted = await on_db_thread(_submit)(request)
    return await answered(submitted, _stream, _whole, refuse=_refused)


messages.csrf_exempt = True  # type: ignore[attr-defined]  # API keys only, never a session cookie
