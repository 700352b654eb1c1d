"""The benchmark's wire pieces (bench/sse.py, bench/wsproto.py, the synthetic source and tap helpers): pure."""

from __future__ import annotations

import json
import os

import pytest

from bench import profile, sse, synthetic, tap, wsproto
from bench.httpserve import Request


def _chunked(body: bytes, sizes: list[int]) -> bytes:
    out, pos = b"", 0
    for size in sizes:
        out += sse.encode_chunk(body[pos : pos + size])
        pos += size
    return out + sse.encode_chunk(body[pos:]) + sse.LAST_CHUNK


def test_chunked_decoder_reassembles_a_body_fed_in_any_pieces():
    body = b"".join(sse.chat_event_line(text=f"tok{i} ") for i in range(20)) + sse.DONE_LINE
    raw = _chunked(body, [7, 100, 1, 250])
    for step in (1, 3, 64, len(raw)):
        decoder = sse.ChunkedDecoder()
        out = b"".join(decoder.feed(raw[i : i + step]) for i in range(0, len(raw), step))
        assert out == body and decoder.done
    with pytest.raises(sse.ProtocolError):
        sse.ChunkedDecoder().feed(b"zz\r\nabc")


def test_sse_parser_and_chat_events_read_llama_server_format():
    parser = sse.SSEParser()
    line = sse.chat_event_line(text="Hi", timings={"predicted_per_second": 140.0})
    events = parser.feed(line[:10]) + parser.feed(line[10:] + b"data: [DONE]\r\n\r\n")
    assert len(events) == 2
    first, done = (sse.parse_chat_event(e) for e in events)
    assert first.text == "Hi" and first.timings == {"predicted_per_second": 140.0} and not first.done
    assert done.done
    end = sse.parse_chat_event(json.dumps({"choices": [{"delta": {}, "finish_reason": "length"}], "timings": {}}))
    assert end.text == "" and end.finish_reason == "length"
    assert sse.parse_chat_event('{"error": {"message": "boom"}}').error
    with pytest.raises(sse.ProtocolError):
        sse.parse_chat_event("{not json")


def test_http_heads_parse():
    head, rest = sse.split_head(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-A: b\r\n\r\nbody")
    response = sse.parse_response_head(head)
    assert response.status == 200 and response.chunked and response.headers["x-a"] == "b" and rest == b"body"
    assert sse.split_head(b"HTTP/1.1 200 OK\r\n") is None
    method, target, headers = sse.parse_request_head(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x")
    assert (method, target, headers) == ("POST", "/v1/chat/completions", {"host": "x"})
    with pytest.raises(sse.ProtocolError):
        sse.parse_response_head(b"garbage")


@pytest.mark.parametrize("size", [0, 5, 125, 126, 65535, 65536, 70000])
def test_websocket_frames_round_trip_masked_and_unmasked(size):
    payload = os.urandom(size)
    for key in (None, b"\x01\x02\x03\x04"):
        frame = wsproto.encode_frame(wsproto.OP_TEXT, payload, mask_key=key)
        assert wsproto.decode_frame(frame[:-1] if size else frame[:1]) is None  # incomplete
        decoded, used = wsproto.decode_frame(frame + b"extra")
        assert decoded.payload == payload and decoded.opcode == wsproto.OP_TEXT and decoded.fin and used == len(frame)
    if size:
        assert wsproto.encode_frame(1, payload, mask_key=b"abcd")[-size:] != payload  # masked on the wire


def test_websocket_accept_key_matches_rfc6455_example():
    assert wsproto.accept_key("dGhlIHNhbXBsZSBub25jZQ==") == "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="


def test_synthetic_directive_and_tokens_are_deterministic_markdown():
    assert synthetic.parse_directive("[synthetic rate=140 tokens=2000 ttft=5] go") == {
        "rate": 140, "tokens": 2000, "ttft": 5,
    }  # fmt: skip
    assert synthetic.parse_directive("no directive") == {"rate": 100, "tokens": 256, "ttft": 20}
    text = "".join(synthetic.synthetic_token(i) for i in range(1200))
    assert text == "".join(synthetic.synthetic_token(i) for i in range(1200))
    assert text.startswith("## Part 1") and "\n- item" in text and "```" in text and "**bold**" in text
    assert all(synthetic.synthetic_token(i) for i in range(1200))  # every event carries text, like a token


def test_tap_forwards_the_request_head_with_connection_close():
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:1\r\nConnection: keep-alive\r\nContent-Length: 2"
    out = tap.forwarded_head(Request("POST", "/v1/chat/completions", {}, b"{}", head))
    assert out.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n") and out.endswith(b"Connection: close\r\n\r\n")
    assert b"keep-alive" not in out and b"Content-Length: 2" in out


def test_tap_recorder_times_each_token_of_a_chunked_stream():
    record = {"events": [], "status": None, "finish_reason": None, "timings": None}
    recorder = tap.Recorder(record)
    end = sse.chat_event_line(text=None, finish_reason="stop", timings={"predicted_n": 2})
    body = b"".join([sse.chat_event_line(text=None), sse.chat_event_line(text="a"), sse.chat_event_line(text="b"), end])
    body += sse.DONE_LINE
    raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + _chunked(body, [30, 200])
    recorder.feed(raw[:40], 1.0)
    recorder.feed(raw[40:], 2.0)
    assert record["status"] == 200 and record["finish_reason"] == "stop" and record["timings"] == {"predicted_n": 2}
    assert [x for _, x in record["events"]] == ["a", "b"] and all(t in (1.0, 2.0) for t, _ in record["events"])


def test_profile_top_counts_busy_samples_only():
    folded = (
        "proc;main (a.py:1);work (a.py:5) 7\nproc;main (a.py:1);work (a.py:9) 3\n"
        "proc;EpollSelector.select (s.py:2) 90\n"
    )
    result = profile.top(folded)
    assert dict(result["total"]) == {"samples": 100, "busy": 10}
    assert result["self"] == [("work (a.py)", 10)] and ("main (a.py)", 10) in result["inclusive"]
