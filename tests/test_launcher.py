"""scripts/run's launcher: the Redis rule, llama-server's threads and what a failed start says."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from rigdash.launcher import Stack, ensure_redis, free_port, redis_answers, wait_http


def test_a_private_redis_is_started_when_none_answers(tmp_path, monkeypatch):
    monkeypatch.setenv("REDIS_URL", f"redis://127.0.0.1:{free_port()}/0")
    stack = Stack()
    try:
        url = ensure_redis(stack, tmp_path)
        assert redis_answers(url)
        assert [name for name, _ in stack.procs] == ["redis"]
    finally:
        stack.stop()
    assert not redis_answers(url)


def test_a_running_redis_is_used_as_it_is(tmp_path, monkeypatch, settings):
    monkeypatch.setenv("REDIS_URL", settings.REDIS_URL)
    stack = Stack()
    assert ensure_redis(stack, tmp_path) == settings.REDIS_URL
    assert stack.procs == []


def test_without_redis_or_redis_server_the_message_says_how_to_get_one(tmp_path, monkeypatch):
    monkeypatch.setenv("REDIS_URL", f"redis://127.0.0.1:{free_port()}/0")
    monkeypatch.setenv("PATH", str(tmp_path))  # no redis-server on it
    with pytest.raises(SystemExit, match="apt-get install redis-server"):
        ensure_redis(Stack(), tmp_path)


def test_llama_server_decodes_on_one_core_fewer_and_reads_prompts_on_all(monkeypatch):
    """Decode is memory-bound: cores - 1 threads decode as fast and leave a core to RigDash and the browser."""
    from rigdash import launcher

    def threads(cmd: list[str]) -> tuple[str, str]:
        return cmd[cmd.index("-t") + 1], cmd[cmd.index("-tb") + 1]

    monkeypatch.delenv("LLAMA_THREADS", raising=False)
    monkeypatch.delenv("LLAMA_THREADS_BATCH", raising=False)
    for cores, expected in ((2, ("1", "2")), (1, ("1", "1")), (16, ("15", "16"))):
        monkeypatch.setattr(launcher.os, "cpu_count", lambda cores=cores: cores)
        assert threads(launcher.llama_server_command(port=1, slots=1, ctx=512)) == expected
    monkeypatch.setenv("LLAMA_THREADS", "3")
    monkeypatch.setenv("LLAMA_THREADS_BATCH", "5")
    assert threads(launcher.llama_server_command(port=1, slots=1, ctx=512)) == ("3", "5")


ALL = frozenset({0, 1, 2, 3})


@pytest.mark.parametrize(
    ("spec", "decode", "rest"),
    [("3", {3}, {0, 1, 2}), ("1-2", {1, 2}, {0, 3}), ("0, 2-3", {0, 2, 3}, {1})],
)
def test_decode_cpus_name_cpus_and_ranges_and_leave_the_rest_to_everything_else(spec, decode, rest):
    from rigdash.launcher import parse_cpu_split

    split = parse_cpu_split(spec, ALL)
    assert (split.decode, split.rest) == (decode, rest)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("one", "expected CPU numbers and ranges"),
        ("2-1", "expected CPU numbers and ranges"),
        ("1,", "expected CPU numbers and ranges"),
        ("-1", "expected CPU numbers and ranges"),
        ("7", "CPU 7 is not one this machine lets RigDash use"),
        ("0-3", "leaves no CPU for RigDash"),
    ],
)
def test_bad_decode_cpus_stop_the_start_with_what_is_wrong(spec, message):
    from rigdash.launcher import parse_cpu_split

    with pytest.raises(SystemExit, match=message):
        parse_cpu_split(spec, ALL)


def test_with_decode_cpus_llama_server_runs_there_alone_on_all_of_them_and_the_launcher_moves_off(monkeypatch):
    """RIGDASH_DECODE_CPUS: llama-server is started through taskset on its CPUs and decodes with one thread per CPU;
    a process that calls keep_off_decode_cpus (the launcher, the benchmark) and what it starts later run on the
    rest. Checked on real processes: the affinity the kernel reports."""
    from rigdash import launcher

    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        pytest.skip("needs two CPUs")
    monkeypatch.delenv("LLAMA_THREADS", raising=False)
    monkeypatch.delenv("LLAMA_THREADS_BATCH", raising=False)
    monkeypatch.setenv("RIGDASH_DECODE_CPUS", str(allowed[-1]))
    launcher._split_of.cache_clear()
    cmd = launcher.llama_server_command(port=1, slots=1, ctx=512)
    assert cmd[:3] == ["taskset", "--cpu-list", str(allowed[-1])]
    assert (cmd[cmd.index("-t") + 1], cmd[cmd.index("-tb") + 1]) == ("1", "1")

    code = "import os, sys; print(sorted(os.sched_getaffinity(0)))"
    pinned = subprocess.run([*cmd[:3], sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert pinned.stdout.strip() == str([allowed[-1]])
    # keep_off_decode_cpus in a child of its own, so that this test process keeps every CPU
    moves_off = (
        "from rigdash import launcher; launcher.keep_off_decode_cpus(launcher.cpu_split()); import subprocess, sys;"
        f" subprocess.run([sys.executable, '-c', {code!r}], check=True)"
    )
    started_later = subprocess.run(
        [sys.executable, "-c", moves_off], capture_output=True, text=True, check=True, cwd=launcher.ROOT
    )
    assert started_later.stdout.strip() == str(allowed[:-1])
    launcher._split_of.cache_clear()


def test_a_server_killed_by_an_illegal_instruction_says_how_to_rebuild():
    """A llama-server built for CPU features this machine lacks (Intel AMX on a VM that lists but cannot run it)
    dies with SIGILL while loading the model: the start must say so, not just 'exited with code -4'."""
    proc = subprocess.Popen([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGILL)"])
    proc.wait(timeout=10)
    with pytest.raises(RuntimeError, match=r"SIGILL.*rebuild"):
        wait_http(f"http://127.0.0.1:{free_port()}/health", timeout_s=5, proc=proc)
