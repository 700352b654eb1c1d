"""An OpenAI API request body read as RigDash's: what RigDash owns is checked, everything else is passed on.

RigDash owns the model, the messages' shape (a list of objects, each with a role) and their size, the stream flags,
the reply's token cap (``max_tokens`` / ``max_completion_tokens``, against the owner's quotas) and ``n`` (a turn is one
reply). Every other field (``tools``, ``tool_choice``, ``response_format``, ``stop``, ``logprobs``, every sampler) goes
to the rig's backend unchanged (``Turn.params["passthrough"]``), which takes it or refuses it in its own words
(docs/openai.md, "Fields"). The body is read strictly (rigdash/strictjson.py): a non-finite or over-long number, or
nesting too deep, is a 400 like any malformed body.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

from inference.backends.base import without_nul
from inference.errors import InvalidInput
from inference.turns.params import params_validate
from rigdash import strictjson

# Read by RigDash; never passed on as they came (the backend request sets its own stream, model, messages and cap).
OWNED = frozenset({"model", "messages", "stream", "stream_options", "max_tokens", "max_completion_tokens", "n"})
# Left out of what goes to the backend: llama-server's choice of slot is RigDash's queue's (placement, the fair
# queue). A request pinned to a slot (``id_slot``) would wait there behind another user's reply, outside the queue,
# where the server would otherwise pick the free slot whose cache holds most of the prompt.
DROPPED = frozenset({"id_slot"})


class BadRequest(InvalidInput):
    def __init__(self, message: str, param: str | None = None, status: int = 400, code: str | None = None) -> None:
        super().__init__("invalid_request_error", message)
        self.param = param
        self.status = status
        self.error_code = code  # OpenAI's ``code``: None, or e.g. unsupported_value


@dataclass(frozen=True)
class ChatCompletionRequest:
    """A ``POST /v1/chat/completions`` body in RigDash's terms."""

    model: str
    history: list[dict[str, Any]]  # the messages before the last one, as the client sent them
    user_text: str  # the last message's text: the turn's text on the board and in the chat list
    stream: bool = False
    include_usage: bool = False
    # RigDash's turn params (inference/turns/params.py): max_tokens, ``passthrough`` (the other fields) and
    # ``message`` (the last message, where it is more than a user's text).
    params: dict[str, Any] = field(default_factory=dict)


def body_read(raw_body: bytes) -> dict[str, Any]:
    """The request's JSON object, read strictly; BadRequest (400, or 413 for a body too large)."""
    limit = settings.API_MAX_BODY_BYTES  # the web server refuses larger bodies unread (rigdash/bodylimit.py)
    if len(raw_body) > limit:
        raise BadRequest(f"The request body is larger than {limit} bytes.", status=413)
    try:
        body = strictjson.loads(raw_body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"The body is not valid JSON: {exc}"[:200]) from exc
    if not isinstance(body, dict):
        raise BadRequest("The body must be a JSON object.")
    # A NUL character (only ever escaped in JSON) becomes U+FFFD: PostgreSQL stores none, in text or jsonb.
    return without_nul(body) if b"\\u0000" in raw_body else body


def message_text(message: dict[str, Any]) -> str:
    """A message's text: its content, or its text parts joined (images and other parts left out)."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text") or "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return ""


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty array", "messages")
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str) or not message["role"]:
            raise BadRequest(f"messages[{index}] must be an object with a role", "messages")
    return messages


def _stream_flags(body: dict[str, Any]) -> tuple[bool, bool]:
    stream, options = body.get("stream", False), body.get("stream_options")
    if not isinstance(stream, bool) and stream is not None:
        raise BadRequest("stream must be a boolean", "stream")
    valid_options = isinstance(options, dict) and isinstance(options.get("include_usage", False), bool)
    if options is not None and not valid_options:
        raise BadRequest("stream_options must be an object with a boolean include_usage", "stream_options")
    return bool(stream), bool(stream and isinstance(options, dict) and options.get("include_usage"))


def _cap(body: dict[str, Any]) -> dict[str, Any]:
    """The reply's token cap, checked against RigDash's limit (the quota checks it again at submit)."""
    if body.get("n") not in (None, 1):
        raise BadRequest("Only n=1 is supported: a request is one turn; ask again for another choice.", "n",
                         code="unsupported_value")  # fmt: skip
    name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    if body.get(name) is None:
        return {}
    try:
        return params_validate({"max_tokens": body[name]})
    except InvalidInput as exc:
        raise BadRequest(exc.message.replace("max_tokens", name, 1), name) from exc


def chat_request_parse(raw_body: bytes) -> ChatCompletionRequest:
    """Check what RigDash owns and keep the rest for the backend; BadRequest says what is wrong."""
    body = body_read(raw_body)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("model must be a non-empty string", "model")
    messages = _messages(body)
    last = messages[-1]
    text = message_text(last)
    limit = settings.RIGDASH.max_message_chars
    if len(text) > limit:
        raise BadRequest(f"The last message is longer than {limit} characters.", "messages")
    stream, include_usage = _stream_flags(body)
    params = _cap(body)
    passthrough = {name: value for name, value in body.items() if name not in OWNED | DROPPED and value is not None}
    if passthrough:
        params["passthrough"] = passthrough
    plain = last["role"] == "user" and set(last) == {"role", "content"} and isinstance(last["content"], str)
    if not (plain and text.strip()):
        params["message"] = last  # a tool's result, an assistant's start to continue, content parts
        text = text if text.strip() else f"({last['role']} message)"
    return ChatCompletionRequest(model, messages[:-1], text, stream, include_usage, params)


def completion_request_parse(raw_body: bytes) -> ChatCompletionRequest:
    """A ``POST /v1/completions`` body: one prompt (a string, or a list of one), sent with no chat template
    (``params["raw_prompt"]``); ``suffix`` and every other field RigDash does not own are passed on."""
    body = body_read(raw_body)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("model must be a non-empty string", "model")
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt.strip():
        raise BadRequest("prompt must be a non-empty string (or a list of one): a request is one turn", "prompt")
    limit = settings.RIGDASH.max_message_chars
    if len(prompt) > limit:
        raise BadRequest(f"The prompt is longer than {limit} characters.", "prompt")
    stream, include_usage = _stream_flags(body)
    params = {**_cap(body), "raw_prompt": True}
    passthrough = {k: v for k, v in body.items() if k not in OWNED | DROPPED | {"prompt"} and v is not None}
    if passthrough:
        params["passthrough"] = passthrough
    return ChatCompletionRequest(model, [], prompt, stream, include_usage, params)
