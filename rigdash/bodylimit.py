"""Request bodies are refused past their route's limit before they are read (Django's ASGI handler spools a whole
body to memory or disk before any view or ``DATA_UPLOAD_MAX_MEMORY_SIZE`` looks at it).

Two route classes: the OpenAI-compatible API (``/v1/``) and llama-server's own (``NATIVE_PATHS``), both
``RIGDASH_API_MAX_BODY_BYTES``, and everything else, pages and RigDash's JSON API (``RIGDASH_MAX_BODY_BYTES``). A
declared Content-Length over the limit is answered 413 at once, unread, and the connection closed; a chunked body is
counted as it arrives and cut off with 413 once past it.
"""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings

ASGIApp = Any
Message = dict[str, Any]
API_PREFIX = "/v1/"
# llama-server's own routes that RigDash serves (inference/urls.py): a code completion carries files for context.
NATIVE_PATHS = frozenset(
    {"/completion", "/completions", "/infill", "/tokenize", "/detokenize", "/rerank", "/reranking"}
)
# The OpenAI routes under llama-server's names without /v1/: the API's limit and OpenAI's shape, as /v1/.
ROOT_OPENAI_PATHS = frozenset({"/chat/completions", "/responses"})


def body_limit_for(path: str) -> int:
    """The largest body, in bytes, a request to ``path`` may carry."""
    api = path.startswith(API_PREFIX) or path in NATIVE_PATHS or path in ROOT_OPENAI_PATHS
    return int(settings.API_MAX_BODY_BYTES if api else settings.MAX_BODY_BYTES)


def too_large_answer(path: str, limit: int) -> tuple[bytes, bytes]:
    """The 413's body and content type, in the route's own error shape."""
    message = f"The request body is larger than {limit} bytes."
    if path.startswith(API_PREFIX) or path in ROOT_OPENAI_PATHS:  # OpenAI's shape (inference/views/openai.py)
        error = {"message": message, "type": "invalid_request_error", "param": None, "code": "request_too_large"}
        return json.dumps({"error": error}).encode(), b"application/json"
    if path in NATIVE_PATHS:  # llama-server's (inference/views/llamacpp_native.py, native_error)
        native = {"code": 413, "message": message, "type": "invalid_request_error"}
        return json.dumps({"error": native}).encode(), b"application/json"
    if path.startswith("/api/"):  # RigDash's JSON API (inference/views/http.py, json_error)
        return json.dumps({"error": {"code": "too_large", "message": message}}).encode(), b"application/json"
    return message.encode(), b"text/plain; charset=utf-8"


def declared_length(scope: dict[str, Any]) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # the HTTP parser has already refused it; nothing to decide here
    return None


async def send_too_large(send: Any, path: str, limit: int) -> None:
    body, content_type = too_large_answer(path, limit)
    headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode()), (b"connection", b"close")]
    await send({"type": "http.response.start", "status": 413, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class BodyLimit:
    """ASGI middleware for http: a body over ``body_limit_for(path)`` is answered 413 and never reaches the app."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        limit = body_limit_for(path)
        length = declared_length(scope)
        if length is not None and length > limit:
            await send_too_large(send, path, limit)
            return None
        return await self.app(scope, *LimitedBody(receive, send, path, limit).channels())


class LimitedBody:
    """One request's ``receive`` counting its body and ``send`` that drops the app's answer once the 413 went out."""

    def __init__(self, receive: Any, send: Any, path: str, limit: int) -> None:
        self._receive, self._send, self.path, self.limit = receive, send, path, limit
        self.received = 0
        self.refused = False
        self.started = False

    def channels(self) -> tuple[Any, Any]:
        return self.receive, self.send

    async def receive(self) -> Message:
        if self.refused:
            return {"type": "http.disconnect"}
        message: Message = await self._receive()
        if message["type"] == "http.request":
            self.received += len(message.get("body", b""))
            if self.received > self.limit:
                # The app sees the client leave (Django drops the request); the client gets the 413.
                self.refused = True
                if not self.started:
                    self.started = True
                    await send_too_large(self._send, self.path, self.limit)
                return {"type": "http.disconnect"}
        return message

    async def send(self, message: Message) -> None:
        if self.refused:
            return
        if message["type"] == "http.response.start":
            self.started = True
        await self._send(message)
