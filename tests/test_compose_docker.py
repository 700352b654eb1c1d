"""The release check (scripts/test-compose: docker-compose.yml on a real Docker engine with stand-in images), from
pytest. It needs root, Debian's docker.io and minutes, so it runs only when RIGDASH_TEST_COMPOSE=1 is set; it is not
part of scripts/test or CI (README, "Release check")."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from rigdash.launcher import ROOT

pytestmark = pytest.mark.skipif(
    os.environ.get("RIGDASH_TEST_COMPOSE") != "1" or os.geteuid() != 0,
    reason="the release check: RIGDASH_TEST_COMPOSE=1, as root (it starts dockerd)",
)


@pytest.mark.timeout(1800)
def test_the_compose_stack_passes_the_release_check() -> None:
    env = {**os.environ, "PYTHON": sys.executable}
    result = subprocess.run([str(ROOT / "scripts" / "test-compose")], env=env, capture_output=True, text=True,
                            timeout=1800, check=False)  # fmt: skip
    print(result.stdout[-20000:], result.stderr[-5000:])
    assert result.returncode == 0, result.stderr[-3000:] or result.stdout[-3000:]
    assert "[test-compose] PASSED" in result.stdout + result.stderr
