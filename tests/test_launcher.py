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


def _threads(cmd: list[str]) -> tuple[str, str]:
    """A llama-server command's -t and -tb: its decode threads and its batch threads."""
    return cmd[cmd.index("-t") + 1], cmd[cmd.index("-tb") + 1]


def test_llama_server_decodes_on_one_core_fewer_and_reads_prompts_on_all(monkeypatch):
    """Decode is memory-bound: cores - 1 threads decode as fast and leave a core to RigDash and the browser."""
    from rigdash import launcher

    monkeypatch.delenv("LLAMA_THREADS", raising=False)
    monkeypatch.delenv("LLAMA_THREADS_BATCH", raising=False)
    for cores, expected in ((2, ("1", "2")), (1, ("1", "1")), (16, ("15", "16"))):
        monkeypatch.setattr(launcher.os, "cpu_count", lambda cores=cores: cores)
        assert _threads(launcher.llama_server_command(port=1, slots=1, ctx=512)) == expected
    monkeypatch.setenv("LLAMA_THREADS", "3")
    monkeypatch.setenv("LLAMA_THREADS_BATCH", "5")
    assert _threads(launcher.llama_server_command(port=1, slots=1, ctx=512)) == ("3", "5")


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


def test_with_decode_cpus_a_llama_server_without_openmp_runs_there_alone_and_the_launcher_moves_off(
    decode_on_last_cpu, monkeypatch, tmp_path
):
    """RIGDASH_DECODE_CPUS with a llama-server not built with OpenMP (one of the user's own, say): only the whole
    process can be pinned, so it is started through taskset on its CPUs and uses one thread per CPU for decode and
    batches alike. A process that calls keep_off_decode_cpus (the launcher, the benchmark) and what it starts later
    run on the rest. Checked on real processes: the affinity the kernel reports."""
    from rigdash import launcher

    allowed = decode_on_last_cpu
    binary, model = tmp_path / "llama-server", tmp_path / "model.gguf"
    binary.write_bytes(b"\x7fELF a build whose threads are ggml's own")
    model.write_bytes(b"GGUF")
    monkeypatch.setenv("LLAMA_SERVER_BIN", str(binary))
    monkeypatch.setenv("LLAMA_MODEL_PATH", str(model))
    cmd = launcher.llama_server_command(port=1, slots=1, ctx=512)
    assert cmd[:4] == ["taskset", "--cpu-list", str(allowed[-1]), str(binary)]
    assert _threads(cmd) == ("1", "1")

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


def _thread_cpu_s(pid: int) -> dict[int, float]:
    """Each thread of the process and its user + system CPU seconds."""
    import psutil

    return {t.id: t.user_time + t.system_time for t in psutil.Process(pid).threads()}


def test_with_decode_cpus_the_real_llama_server_decodes_there_and_reads_prompts_on_every_cpu(decode_on_last_cpu):
    """The embedded llama-server (built with OpenMP): OMP_PLACES binds its main thread, which decodes a lone reply,
    to the split's CPU, and the batch thread to the others. A long prompt keeps both busy: it is read on every CPU,
    as fast as without the split. Real process; the kernel's affinities and CPU time per thread."""
    import httpx

    from rigdash import launcher

    allowed = decode_on_last_cpu
    if not launcher.follows_openmp_places(os.environ.get("LLAMA_SERVER_BIN", "")):
        pytest.fail("the embedded llama-server is built with OpenMP (scripts/build-llama-server): this one is not")
    port = free_port()
    cmd = launcher.llama_server_command(port=port, slots=1, ctx=2048, extra=["--no-cache-prompt"])
    assert cmd[:3] == ["taskset", "--cpu-list", ",".join(map(str, allowed))]
    assert _threads(cmd) == ("1", str(len(allowed)))
    stack = Stack()
    try:
        proc = stack.start("llama-server", cmd)
        wait_http(f"http://127.0.0.1:{port}/health", timeout_s=120, proc=proc)
        cpus = launcher.thread_cpus(proc.pid)
        assert cpus[proc.pid] == {allowed[-1]}
        batch = [tid for tid, on in cpus.items() if not on & {allowed[-1]}]
        assert batch, f"no llama-server thread off CPU {allowed[-1]}: {cpus}"
        split = launcher.cpu_split()
        assert split is not None
        assert launcher.describe_llama_cpus(proc.pid, split) == (
            f"llama-server decodes on CPU {allowed[-1]} and reads prompts on CPU {','.join(map(str, allowed))}"
        )
        before = _thread_cpu_s(proc.pid)
        prompt = "Summarise the history of lighthouses and their keepers. " * 120  # about 1,300 tokens
        body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": 1, "temperature": 0}
        reply = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=120).json()
        assert reply["timings"]["prompt_n"] > 1000
        after = _thread_cpu_s(proc.pid)
        spent = {tid: after[tid] - before[tid] for tid in [proc.pid, *batch]}
        # both sides of the split worked on the prompt (at least 0.2 s of CPU each; the read takes seconds here)
        assert spent[proc.pid] >= 0.2 and sum(spent[t] for t in batch) >= 0.2, spent
    finally:
        stack.stop()


def test_a_llama_server_whose_main_thread_is_not_on_the_split_cpus_is_reported(decode_on_last_cpu):
    from rigdash import launcher

    split = launcher.cpu_split()
    assert split is not None
    free = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])  # every CPU, as if unpinned
    try:
        assert launcher.describe_llama_cpus(free.pid, split).startswith("WARNING: llama-server's main thread may run")
    finally:
        free.kill()
        free.wait()


def test_a_server_killed_by_an_illegal_instruction_says_how_to_rebuild():
    """A llama-server built for CPU features this machine lacks (Intel AMX on a VM that lists but cannot run it)
    dies with SIGILL while loading the model: the start must say so, not just 'exited with code -4'."""
    proc = subprocess.Popen([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGILL)"])
    proc.wait(timeout=10)
    with pytest.raises(RuntimeError, match=r"SIGILL.*rebuild"):
        wait_http(f"http://127.0.0.1:{free_port()}/health", timeout_s=5, proc=proc)
