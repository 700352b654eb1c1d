"""The OpenAI-compatible API's edge (/v1/): API-key authentication, OpenAI's error shape, the model list and the
parsing of a chat completion request.

Protocol: https://platform.openai.com/docs/api-reference (``GET /v1/models``, ``POST /v1/chat/completions``).
Requests authenticate with a RigDash API key only (``Authorization: Bearer rdk_...``), never a session cookie,
which is why these views need no CSRF token.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from inference.backends.base import BackendError
from inference.board import apikeys
from inference.errors import InvalidInput
from inference.models import Rig
from inference.turns.params import params_validate
from inference.turns.selectors import rig_list_enabled
from inference.turns.sessions import rig_models
from rigdash import strictjson

ROLES = ("system", "user", "assistant")
# Accepted and ignored: they change nothing RigDash sends (``user`` is OpenAI's end-user tag).
IGNORED_FIELDS = {"user", "frequency_penalty", "presence_penalty", "store", "metadata"}
PARAMS = ("temperature", "top_p", "seed")
# Read here: the messages and what shapes the answer.
FIELDS = {"model", "messages", "stream", "stream_options", "max_tokens", "max_completion_tokens", "n", "logprobs",
          "response_format", *PARAMS, *IGNORED_FIELDS}  # fmt: skip
# Any other field with a value (``tools``, ``tool_choice``, ``top_logprobs``, ``stop``, ...) is refused by name with
# ``unsupported_parameter``, and a supported one's value RigDash cannot honour (``n`` > 1, ``logprobs`` true, a
# ``response_format`` other than text) with ``unsupported_value``: never silently ignored. A null is a field left out,
# as OpenAI reads it.


def openai_error(status: int, message: str, *, code: str | None = None, param: str | None = None,
                 kind: str = "invalid_request_error") -> JsonResponse:  # fmt: skip
    """OpenAI's error body: ``{"error": {"message", "type", "param", "code"}}``."""
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return JsonResponse(body, status=status)


View = Callable[..., HttpResponse]


def key_required(view: View) -> View:
    """Authenticate by API key; the view gets ``request.api_key`` and ``request.user`` (the key's owner)."""

    @csrf_exempt
    @functools.wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        try:
            key = apikeys.api_key_authenticate(request.headers.get("Authorization", ""))
        except apikeys.KeyRejected as exc:
            response = openai_error(401, exc.message, code="invalid_api_key")
            response["WWW-Authenticate"] = 'Bearer realm="rigdash-api"'
            return response
        request.api_key = key  # type: ignore[attr-defined]
        request.user = key.owner
        return view(request, *args, **kwargs)

    return wrapped


@dataclass(frozen=True)
class CatalogueEntry:
    """A model id of the API. ``<model>``: any enabled rig serving it, each request placed on one with a free slot
    (inference/queue/placement.py); ``<rig>/<model>``: that rig only, listed where several rigs serve the model."""

    id: str
    rig: Rig  # the rig, or for a placed id the first that serves it (``owned_by``)
    model: str
    context_length: int | None = None
    placed: bool = False


def model_catalogue() -> list[CatalogueEntry]:
    """Every model the enabled rigs serve (a rig whose backend cannot say is left out); the rigs' lists are the ones
    kept for pages (inference/live/served.py), not a backend round trip per request."""
    found: list[tuple[Rig, str, int | None]] = []
    for rig in rig_list_enabled().order_by("-is_default", "name"):
        try:
            found.extend((rig, m.name, m.context_length) for m in rig_models(rig))
        except BackendError:
            continue
    entries: dict[str, CatalogueEntry] = {}
    for rig, model, ctx in found:
        entries.setdefault(model, CatalogueEntry(model, rig, model, ctx, placed=True))
    names = [model for _, model, _ in found]
    pinned = [
        CatalogueEntry(f"{rig.name}/{model}", rig, model, ctx) for rig, model, ctx in found if names.count(model) > 1
    ]
    return [*entries.values(), *pinned]


def model_resolve(model_id: str, catalogue: list[CatalogueEntry]) -> CatalogueEntry | None:
    """The entry of ``model_id``; ``<rig>/<model>`` names that rig's model even where it is listed under its name."""
    by_id = next((entry for entry in catalogue if entry.id == model_id), None)
    if by_id is not None:
        return by_id
    pinned = next((e for e in catalogue if f"{e.rig.name}/{e.model}" == model_id), None)
    return None if pinned is None else CatalogueEntry(model_id, pinned.rig, pinned.model, pinned.context_length)


def model_object(entry: CatalogueEntry) -> dict[str, Any]:
    return {"id": entry.id, "object": "model", "created": int(entry.rig.created_at.timestamp()),
            "owned_by": entry.rig.name}  # fmt: skip


@dataclass(frozen=True)
class ChatCompletionRequest:
    """A validated ``POST /v1/chat/completions`` body in RigDash's terms."""

    model: str
    history: list[dict[str, str]]  # the messages before the last user message
    user_text: str
    stream: bool = False
    include_usage: bool = False
    params: dict[str, Any] = field(default_factory=dict)  # RigDash's turn params (inference/turns/params.py)


class BadRequest(InvalidInput):
    def __init__(self, message: str, param: str | None = None, status: int = 400, code: str | None = None) -> None:
        super().__init__("invalid_request_error", message)
        self.param = param
        self.status = status
        self.error_code = code  # OpenAI's ``code``: None, or e.g. unsupported_parameter, unsupported_value


def _unsupported_value(message: str, param: str) -> BadRequest:
    return BadRequest(message, param, code="unsupported_value")


def _content(message: Any, index: int) -> tuple[str, str]:
    if not isinstance(message, dict) or message.get("role") not in ROLES:
        raise BadRequest(f"messages[{index}] must be an object with a role of {', '.join(ROLES)}", "messages")
    content = message.get("content")
    if isinstance(content, list):  # content parts: text only
        if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content):
            raise BadRequest(f"messages[{index}].content: only text parts are supported", "messages")
        content = "".join(part["text"] for part in content)
    if not isinstance(content, str):
        raise BadRequest(f"messages[{index}].content must be a string", "messages")
    return message["role"], content


def _stream_flags(body: dict[str, Any]) -> tuple[bool, bool]:
    stream, options = body.get("stream", False), body.get("stream_options")
    if not isinstance(stream, bool) and stream is not None:
        raise BadRequest("stream must be a boolean", "stream")
    valid_options = isinstance(options, dict) and isinstance(options.get("include_usage", False), bool)
    if options is not None and not valid_options:
        raise BadRequest("stream_options must be an object with a boolean include_usage", "stream_options")
    return bool(stream), bool(stream and isinstance(options, dict) and options.get("include_usage"))


def _params(body: dict[str, Any]) -> dict[str, Any]:
    raw = {name: body[name] for name in PARAMS if body.get(name) is not None}
    max_tokens_field = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    if body.get(max_tokens_field) is not None:
        raw["max_tokens"] = body[max_tokens_field]
    if body.get("n") not in (None, 1):
        raise _unsupported_value("Only n=1 is supported: ask again for another choice.", "n")
    if body.get("logprobs") not in (None, False):
        raise _unsupported_value("logprobs are not supported.", "logprobs")
    response_format = body.get("response_format")
    if response_format is not None and response_format != {"type": "text"}:
        kind = response_format.get("type") if isinstance(response_format, dict) else None
        raise _unsupported_value(f"response_format: only type 'text' is supported, not {kind!r}.", "response_format")
    try:
        return params_validate(raw)
    except InvalidInput as exc:
        named = next((name for name in raw if exc.message.startswith(name)), None)
        param = max_tokens_field if named == "max_tokens" else named
        raise BadRequest(exc.message, param) from exc


def chat_request_parse(raw_body: bytes) -> ChatCompletionRequest:
    """Validate a request body; BadRequest (400, or 413 for a body too large) says what is wrong."""
    limit = settings.API_MAX_BODY_BYTES  # the web server refuses larger bodies unread (rigdash/bodylimit.py)
    if len(raw_body) > limit:
        raise BadRequest(f"The request body is larger than {limit} bytes.", status=413)
    try:
        body = strictjson.loads(raw_body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest("The body is not valid JSON (numbers must be finite and short, nesting shallow).") from exc
    if not isinstance(body, dict):
        raise BadRequest("The body must be a JSON object.")
    unknown = sorted(name for name, value in body.items() if name not in FIELDS and value is not None)
    if unknown:
        raise BadRequest(f"Unsupported parameter: '{unknown[0]}' is not supported by RigDash.", unknown[0],
                         code="unsupported_parameter")  # fmt: skip
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("model must be a non-empty string", "model")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty array", "messages")
    turns = [_content(message, index) for index, message in enumerate(messages)]
    role, user_text = turns[-1]
    if role != "user" or not user_text.strip():
        raise BadRequest("The last message must be a non-empty user message.", "messages")
    if len(user_text) > settings.RIGDASH.max_message_chars:
        raise BadRequest(f"The last message is longer than {settings.RIGDASH.max_message_chars} characters.",
                         "messages")  # fmt: skip
    stream, include_usage = _stream_flags(body)
    history = [{"role": r, "content": c} for r, c in turns[:-1]]
    return ChatCompletionRequest(model, history, user_text, stream, include_usage, _params(body))


@key_required
def models_list(request: HttpRequest) -> HttpResponse:
    if request.method != "GET":
        return openai_error(405, "Use GET.", code="method_not_allowed")
    return JsonResponse({"object": "list", "data": [model_object(entry) for entry in model_catalogue()]})


@key_required
def model_detail(request: HttpRequest, model_id: str) -> HttpResponse:
    if request.method != "GET":
        return openai_error(405, "Use GET.", code="method_not_allowed")
    entry = model_resolve(model_id, model_catalogue())
    if entry is None:
        return openai_error(404, f"The model '{model_id}' does not exist", code="model_not_found", param="model")
    return JsonResponse(model_object(entry))
