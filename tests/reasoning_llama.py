"""A second real llama-server whose chat template makes SmolLM2 reason: the template opens the assistant's turn
with ``<think>`` (as Qwen3's does), so llama-server's reasoning parser (``--reasoning-format deepseek``) streams the
model's first words as ``delta.reasoning_content``. ``enable_thinking: false`` (``chat_template_kwargs``) closes
the thinking block in the prompt instead, and the words arrive as content. SmolLM2 never writes ``</think>``
itself, so with thinking on a reply is thinking only."""

from __future__ import annotations

from pathlib import Path

import pytest

from rigdash.launcher import Stack, free_port, llama_server_command, wait_http
from tests.conftest import LOG_DIR

TEMPLATE = Path(__file__).parent / "data" / "reasoning-chatml.jinja"


@pytest.fixture(name="reasoning_llama_url", scope="session")
def reasoning_llama_fixture(stack: Stack) -> str:
    port = free_port()
    extra = ["--jinja", "--chat-template-file", str(TEMPLATE), "--reasoning-format", "deepseek"]
    proc = stack.start(
        "llama-server-reasoning",
        llama_server_command(port=port, slots=1, ctx=2048, extra=extra),
        log_path=LOG_DIR / "llama-server-reasoning.log",
    )
    url = f"http://127.0.0.1:{port}"
    wait_http(f"{url}/health", timeout_s=120, proc=proc)
    return url
