"""A rig agent's Celery worker ends with its agent, even when the agent is killed with SIGKILL (the OOM killer's
signal), with real processes: the agent as a deployment starts it (``manage.py rigdash_agent --rig NAME``), and each
of rigdash/parentwatch.py's two mechanisms on its own (the kernel's parent-death signal, the worker's watchdog)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator

import psutil
import pytest

from inference.models import Rig
from rigdash.launcher import ROOT
from tests.conftest import LOG_DIR, wait_until

KEY = "lifetime-agent-key-" + "k" * 24


def _gone(pid: int) -> bool:
    """The process has exited (a zombie waiting for a reaper that is not us counts as exited)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _wait_gone(pid: int, timeout_s: float) -> float:
    started = time.monotonic()
    wait_until(lambda: _gone(pid), timeout_s=timeout_s, what=f"process {pid} to exit")
    return time.monotonic() - started


@pytest.fixture
def leftovers() -> Iterator[list[int]]:
    """Pids to SIGKILL after the test if the code under test left them running."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        if not _gone(pid):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.django_db(transaction=True)
def test_the_agents_worker_exits_when_the_agent_is_killed(service_env: dict[str, str], leftovers: list[int]) -> None:
    rig = Rig.objects.create(name="lifetime", kind=Rig.Kind.LLAMACPP, base_url="http://127.0.0.1:9",
                             queue="rig.lifetime", agent_key=KEY)  # fmt: skip
    env = {**os.environ, **service_env, "RIGDASH_AGENT_KEY": KEY}
    cmd = [sys.executable, "manage.py", "rigdash_agent", "--rig", rig.name, "--concurrency", "1", "--interval", "1"]
    with open(LOG_DIR / "agent-lifetime.log", "ab") as log:
        agent = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    leftovers.append(agent.pid)
    worker = wait_until(lambda: next(iter(psutil.Process(agent.pid).children()), None), timeout_s=30, what="worker")
    leftovers.append(worker.pid)
    from rigdash.celery import app

    name = f"agent-{rig.name}@{socket.gethostname()}"
    wait_until(lambda: any(name in reply for reply in app.control.ping(timeout=0.5)), timeout_s=60,
               what="the agent's worker to answer")  # fmt: skip

    os.kill(agent.pid, signal.SIGKILL)
    agent.wait(timeout=5)
    took_s = _wait_gone(worker.pid, timeout_s=10)
    assert took_s < 10


def _parent_with_child(child_code: str, *, deathsig: bool) -> tuple[subprocess.Popen[bytes], int]:
    """A parent process that starts ``child_code`` (with the parent-death signal or without) and sleeps; its child's
    pid."""
    parent_code = textwrap.dedent(f"""
        import os, subprocess, sys, time
        from rigdash import parentwatch
        me = os.getpid()
        child = subprocess.Popen([sys.executable, "-c", {child_code!r}], env=parentwatch.child_env(me),
                                 preexec_fn=parentwatch.die_with_parent(me) if {deathsig} else None)
        print(child.pid, flush=True)
        time.sleep(120)
    """)
    parent = subprocess.Popen([sys.executable, "-c", parent_code], cwd=ROOT, stdout=subprocess.PIPE)
    assert parent.stdout is not None
    return parent, int(parent.stdout.readline())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_the_kernel_ends_a_child_whose_parent_is_killed(leftovers: list[int]) -> None:
    """The parent-death signal alone: the child runs no watchdog."""
    parent, child = _parent_with_child("import time; time.sleep(120)", deathsig=True)
    leftovers.extend([parent.pid, child])
    time.sleep(0.3)
    assert not _gone(child)
    parent.kill()
    parent.wait()
    assert _wait_gone(child, timeout_s=5) < 2


def test_the_watchdog_ends_a_child_whose_parent_is_killed(leftovers: list[int]) -> None:
    """The portable fallback alone: no parent-death signal, the child's own thread sees its parent change."""
    child_code = textwrap.dedent("""
        import os, time
        from rigdash import parentwatch
        parentwatch.watch_parent(int(os.environ[parentwatch.PARENT_ENV]), interval_s=0.2)
        time.sleep(120)
    """)
    parent, child = _parent_with_child(child_code, deathsig=False)
    leftovers.extend([parent.pid, child])
    time.sleep(0.5)
    assert not _gone(child)
    parent.kill()
    parent.wait()
    assert _wait_gone(child, timeout_s=5) < 3


def test_a_child_that_ignores_sigterm_is_killed_after_the_grace(leftovers: list[int]) -> None:
    child_code = textwrap.dedent("""
        import os, signal, time
        from rigdash import parentwatch
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        parentwatch.watch_parent(int(os.environ[parentwatch.PARENT_ENV]), interval_s=0.2, grace_s=0.5)
        time.sleep(120)
    """)
    parent, child = _parent_with_child(child_code, deathsig=False)
    leftovers.extend([parent.pid, child])
    time.sleep(0.5)
    parent.kill()
    parent.wait()
    assert _wait_gone(child, timeout_s=5) < 3
