"""Request bodies past their route's limit are refused before they are read (rigdash/bodylimit.py), over the network
with the real web server (uvicorn, as scripts/run starts it): a declared Content-Length at once, a chunked body as
soon as it passes the limit, each in its route's error shape."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

from rigdash.bodylimit import BodyLimit
from rigdash.launcher import Stack, free_port, wait_http, web_command
from tests.conftest import LOG_DIR

PAGE_LIMIT = 256 * 1024
API_LIMIT = 64 * 1024


@pytest.fixture(scope="module")
def limited_web(stack: Stack, service_env: dict[str, str]) -> Iterator[tuple[str, int]]:
    """A web server with small limits (RIGDASH_MAX_BODY_BYTES, RIGDASH_API_MAX_BODY_BYTES): host and port."""
    processes = Stack()
    port = free_port()
    env = {**service_env, "RIGDASH_MAX_BODY_BYTES": str(PAGE_LIMIT), "RIGDASH_API_MAX_BODY_BYTES": str(API_LIMIT)}
    proc = processes.start("web-limited", web_command(host="127.0.0.1", port=port), env=env,
                           log_path=LOG_DIR / "web-limited.log")  # fmt: skip
    try:
        wait_http(f"http://127.0.0.1:{port}/static/rigdash/app.css", timeout_s=60, proc=proc)
        yield "127.0.0.1", port
    finally:
        processes.stop()


def _head(path: str, port: int, headers: dict[str, str]) -> bytes:
    lines = [f"POST {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _read_answer(sock: socket.socket, timeout_s: float = 10) -> tuple[int, dict[str, str], bytes]:
    """Status, headers and body of one HTTP/1.1 answer with a Content-Length."""
    sock.settimeout(timeout_s)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"closed before an answer: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in header_lines)}
    while len(body) < int(headers.get("content-length", 0)):
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return int(status_line.split()[1]), headers, body


def _closed_by_server(sock: socket.socket, timeout_s: float = 5) -> bool:
    sock.settimeout(timeout_s)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_a_declared_50_mb_body_is_refused_before_any_of_it_is_sent(limited_web):
    host, port = limited_web
    with socket.create_connection((host, port)) as sock:
        started = time.monotonic()
        sock.sendall(_head("/v1/chat/completions", port, {"Content-Length": str(50 * 1024 * 1024),
                                                          "Content-Type": "application/json"}))  # fmt: skip
        status, headers, body = _read_answer(sock)
        answered_s = time.monotonic() - started
        assert status == 413
        assert answered_s < 2.0, f"the 413 took {answered_s:.3f} s"
        error = json.loads(body)["error"]  # OpenAI's shape for /v1/
        assert error["type"] == "invalid_request_error" and error["code"] == "request_too_large"
        assert str(API_LIMIT) in error["message"]
        assert headers["connection"] == "close"
        assert _closed_by_server(sock)  # nothing of the body was ever sent, nor waited for


def test_a_page_route_has_its_own_limit_and_shape(limited_web):
    host, port = limited_web
    with socket.create_connection((host, port)) as sock:
        sock.sendall(_head("/login/", port, {"Content-Length": str(PAGE_LIMIT + 1),
                                             "Content-Type": "application/x-www-form-urlencoded"}))  # fmt: skip
        status, headers, body = _read_answer(sock)
    assert status == 413 and headers["content-type"].startswith("text/plain")
    assert str(PAGE_LIMIT).encode() in body
    with socket.create_connection((host, port)) as sock:
        sock.sendall(_head("/api/sessions/import", port, {"Content-Length": str(PAGE_LIMIT + 1)}))
        status, _, body = _read_answer(sock)
    assert status == 413 and json.loads(body)["error"]["code"] == "too_large"


def test_llama_servers_own_routes_take_the_apis_limit_in_its_shape(limited_web):
    """/infill carries files for context: the API's limit, not the pages'; the 413 in llama-server's shape."""
    host, port = limited_web
    with socket.create_connection((host, port)) as sock:
        sock.sendall(_head("/infill", port, {"Content-Length": str(API_LIMIT + 1), "Content-Type": "application/json"}))
        status, _, body = _read_answer(sock)
    assert status == 413 and json.loads(body)["error"] == {
        "code": 413, "message": f"The request body is larger than {API_LIMIT} bytes.", "type": "invalid_request_error"
    }  # fmt: skip


def _send_chunked(sock: socket.socket, total: int, chunk_size: int = 16 * 1024) -> int:
    """Send up to ``total`` bytes as chunks; the bytes sent before the server stopped taking them."""
    sent = 0
    try:
        while sent < total:
            size = min(chunk_size, total - sent)
            sock.sendall(f"{size:x}\r\n".encode() + b"a" * size + b"\r\n")
            sent += size
        sock.sendall(b"0\r\n\r\n")
    except (BrokenPipeError, ConnectionResetError):
        pass
    return sent


def test_a_chunked_body_past_the_limit_is_cut_off_with_413(limited_web):
    host, port = limited_web
    with socket.create_connection((host, port)) as sock:
        sock.sendall(_head("/v1/chat/completions", port, {"Transfer-Encoding": "chunked",
                                                          "Content-Type": "application/json"}))  # fmt: skip
        sent = _send_chunked(sock, 50 * 1024 * 1024)
        status, _, body = _read_answer(sock)
    assert status == 413
    assert json.loads(body)["error"]["code"] == "request_too_large"
    assert sent < 50 * 1024 * 1024, "the server read the whole body instead of closing the connection"


def test_bodies_under_the_limit_reach_the_view(limited_web):
    """Under the limit the request is answered by the route itself: the API asks for a key, the login page for
    its CSRF token (no 413), whether the body's length was declared or chunked."""
    host, port = limited_web
    body = b'{"model": "m", "messages": [], "pad": "' + b"x" * (API_LIMIT - 100) + b'"}'
    with socket.create_connection((host, port)) as sock:
        sock.sendall(_head("/v1/chat/completions", port, {"Content-Length": str(len(body)),
                                                          "Content-Type": "application/json"}) + body)  # fmt: skip
        status, _, answer = _read_answer(sock)
    assert status == 401, answer
    with socket.create_connection((host, port)) as sock:
        sock.sendall(_head("/login/", port, {"Transfer-Encoding": "chunked",
                                             "Content-Type": "application/x-www-form-urlencoded"}))  # fmt: skip
        _send_chunked(sock, PAGE_LIMIT - 1024)
        status, _, answer = _read_answer(sock)
    assert status == 403, answer[:300]  # CSRF: the view's own refusal, after the whole body was read


async def test_the_app_never_answers_after_the_413():
    """In-process: the app sees the client leave once the body passes the limit, and whatever it sends is dropped."""
    sent: list[dict[str, Any]] = []
    parts = iter([b"a" * 600, b"a" * 600, b""])

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": next(parts), "more_body": True}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        assert (await receive())["type"] == "http.request"
        assert (await receive())["type"] == "http.disconnect"
        await send({"type": "http.response.start", "status": 200, "headers": []})

    from django.test import override_settings

    with override_settings(MAX_BODY_BYTES=1000):
        await BodyLimit(app)({"type": "http", "path": "/chats/", "headers": []}, receive, send)
    assert [m.get("status") for m in sent if m["type"] == "http.response.start"] == [413]
