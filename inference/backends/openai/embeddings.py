"""OpenAI's ``POST /v1/embeddings`` on a server that speaks it (llama-server started with ``--embeddings``, vLLM,
LM Studio...), and any request a server answers whole (``answer_post``): the body goes as the client sent it, the
model named as the server knows it.

https://platform.openai.com/docs/api-reference/embeddings. Whether a server serves embeddings is learnt by asking:
a refusal (llama-server's 501 "Start it with ``--embeddings``") is a BackendRefused with its status and words.
"""

from __future__ import annotations

import ssl
from typing import Any, cast

import httpx

from inference.backends import failures
from inference.backends.base import BackendProtocolError, BackendRefused, BackendUnavailable, ModelNotLoaded


async def embeddings_post(
    *,
    server: str,
    base_url: str,
    body: dict[str, Any],
    timeout_s: float,
    tls: ssl.SSLContext | bool = True,
    headers: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The server's answer to ``body`` (OpenAI's list of embeddings); BackendRefused for any refusal."""
    payload = await answer_post(server=server, base_url=base_url, path="/v1/embeddings", body=body,
                                timeout_s=timeout_s, tls=tls, headers=headers)  # fmt: skip
    if not isinstance(payload, dict) or not isinstance(payload.get("data"), list):
        raise BackendProtocolError(f"{server} sent something that is not a list of embeddings: {str(payload)[:200]!r}")
    return payload


async def rerank_post(
    *,
    server: str,
    base_url: str,
    body: dict[str, Any],
    timeout_s: float,
    tls: ssl.SSLContext | bool = True,
    headers: dict[str, str] | None = None,
) -> dict[str, Any] | list[Any]:
    """The server's answer to a rerank request at ``/v1/rerank`` (llama-server's, vLLM's, LocalAI's): Jina's object
    with its ``results``, or TEI's list; BackendRefused for any refusal (a server without the route: its 404)."""
    answer = await answer_post(server=server, base_url=base_url, path="/v1/rerank", body=body, timeout_s=timeout_s,
                               tls=tls, headers=headers)  # fmt: skip
    results = answer.get("results") if isinstance(answer, dict) else answer
    if not isinstance(results, list) or not all(isinstance(item, dict) for item in results):
        raise BackendProtocolError(f"{server} sent a rerank answer without results: {str(answer)[:200]!r}")
    return cast(dict[str, Any] | list[Any], answer)


async def answer_post(
    *,
    server: str,
    base_url: str,
    path: str,
    body: dict[str, Any],
    timeout_s: float,
    tls: ssl.SSLContext | bool = True,
    headers: dict[str, str] | None = None,
) -> Any:
    """The server's JSON answer to ``body`` at ``path`` (a request answered whole: embeddings, a rerank);
    BackendRefused for any refusal, with its status and words."""
    try:
        async with httpx.AsyncClient(
            base_url=base_url, timeout=timeout_s, trust_env=False, verify=tls, headers=headers
        ) as client:
            response = await client.post(path, json=body)
    except httpx.HTTPError as exc:
        raise BackendUnavailable(f"{server} at {base_url} is unreachable: {exc!r}") from exc
    try:
        payload = response.json()
    except ValueError:
        payload = None
    if response.status_code >= 400:
        error = payload.get("error") if isinstance(payload, dict) else None
        words = str((error.get("message") if isinstance(error, dict) else error) or response.text[:300])[:500]
        # A refusal goes back to the client in the server's status and words; a model the server will not load for
        # a request is told as a chat turn tells it (its words alone, "model is not loaded", say not why).
        if isinstance(found := failures.classify(server, words, status=response.status_code), ModelNotLoaded):
            raise found
        raise BackendRefused(server, response.status_code, words)
    if payload is None:
        raise BackendProtocolError(f"{server} sent something that is not JSON for {path}: {response.text[:200]!r}")
    return payload
