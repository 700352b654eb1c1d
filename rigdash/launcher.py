"""Start RigDash with the embedded llama-server: Redis check, migrations, worker, web server, one Ctrl-C.

``scripts/run`` builds llama-server and the model first, then runs ``python -m rigdash.launcher``.
The process helpers here are also used by the test suite to start the same pieces.
"""

from __future__ import annotations

import functools
import mmap
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from rigdash.cpus import CpuSplit, _cpu_numbers, cpu_list, thread_cpus
from rigdash.cpushare import share_for

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable


def log(message: str) -> None:
    print(f"[rigdash] {message}", flush=True)


def port_open(host: str, port: int, timeout_s: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def redis_answers(url: str) -> bool:
    import redis

    from rigdash.redistls import with_tls

    try:  # a rediss:// URL verified as RigDash's settings will verify it (RIGDASH_REDIS_CA_FILE)
        return bool(redis.Redis.from_url(with_tls(url), socket_connect_timeout=1, socket_timeout=1).ping())
    except redis.RedisError:
        return False


def _exit_hint(returncode: int) -> str:
    if returncode == -signal.SIGILL:
        return (
            " (SIGILL: the binary uses a CPU instruction this machine cannot run; a llama-server built on another"
            " machine? delete it from ~/.cache/rigdash/llama-server and start again to rebuild it here)"
        )
    return ""


def wait_http(url: str, *, timeout_s: float, proc: subprocess.Popen[bytes] | None = None) -> None:
    """Wait until ``url`` answers 200 (llama-server answers 503 while loading the model)."""
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process for {url} exited with code {proc.returncode}{_exit_hint(proc.returncode)}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310 - loopback URL we built
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError) as exc:
            last = repr(exc)
        time.sleep(0.2)
    raise TimeoutError(f"{url} did not answer within {timeout_s:g} s ({last})")


def parse_cpu_split(spec: str, allowed: frozenset[int]) -> CpuSplit:
    """``"1"``, ``"2-7"`` or ``"0,2-3"`` out of the CPUs this process may use; a clear error for anything else."""
    decode = _cpu_numbers(spec)
    if decode is None:
        raise SystemExit(f"RIGDASH_DECODE_CPUS={spec!r}: expected CPU numbers and ranges such as 1 or 2-7 or 0,2-3")
    if not decode <= allowed:
        raise SystemExit(
            f"RIGDASH_DECODE_CPUS={spec!r}: CPU {cpu_list(frozenset(decode - allowed))} is not one this machine lets "
            f"RigDash use (CPUs {cpu_list(allowed)})"
        )
    if decode == allowed:
        raise SystemExit(
            f"RIGDASH_DECODE_CPUS={spec!r} leaves no CPU for RigDash and the rest: name fewer than all of "
            f"CPUs {cpu_list(allowed)}, or unset it to share every CPU"
        )
    return CpuSplit(frozenset(decode), allowed - frozenset(decode))


def cpu_split() -> CpuSplit | None:
    """The CPU split ``RIGDASH_DECODE_CPUS`` asks for (Linux only), or None: every process may run on every CPU.

    Off by default. On a 2-core VM with the browser on the rig, other processes running on llama-server's core
    cost its decode several points of its rate; a core of its own gives them back but puts RigDash and the
    browser on the one left, which costs display lag (README, "A small CPU rig with the browser on it").
    Prompts and several slots' batches still use every CPU where llama-server is built with OpenMP
    (_split_launch); otherwise they are read more slowly, on the split's CPUs alone.
    """
    spec = os.environ.get("RIGDASH_DECODE_CPUS", "").strip()
    return _split_of(spec) if spec else None


@functools.cache
def _split_of(spec: str) -> CpuSplit:
    # Cached: the first call sees every CPU this process may use; after keep_off_decode_cpus it sees only the rest.
    if not hasattr(os, "sched_getaffinity") or not shutil.which("taskset"):
        raise SystemExit("RIGDASH_DECODE_CPUS needs Linux's CPU affinity and taskset (util-linux): unset it here")
    return parse_cpu_split(spec, frozenset(os.sched_getaffinity(0)))


# libgomp's entry point for a parallel region (LLVM's libomp exports it too): the binary uses OpenMP's threads.
OPENMP_MARK = b"GOMP_parallel"


@functools.cache
def follows_openmp_places(binary: str) -> bool:
    """Whether this llama-server runs its compute threads on OpenMP (GGML_OPENMP, ggml's default where the compiler
    has it, as in scripts/build-llama-server), so that OMP_PLACES binds each of them to a CPU of its own."""
    try:
        with open(binary, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as image:
            return image.find(OPENMP_MARK) != -1
    except (OSError, ValueError):
        return False


def _split_launch(split: CpuSplit, binary: str) -> tuple[list[str], int, int]:
    """The command prefix that keeps llama-server's decode on the split's CPUs, and its decode and batch threads.

    With OpenMP, thread i of every compute region runs on place i (OMP_PROC_BIND=close from the main thread's
    place, the first): the decode's threads on the split's CPUs, a batch's (a prompt, several slots at once) on
    every CPU, so prompts are read as fast as without the split. Without OpenMP only the whole process can be
    pinned: it decodes and reads prompts on the split's CPUs alone."""
    if not follows_openmp_places(binary):
        return ["taskset", "--cpu-list", cpu_list(split.decode)], len(split.decode), len(split.decode)
    places = ",".join(f"{{{cpu}}}" for cpu in [*sorted(split.decode), *sorted(split.rest)])
    prefix = ["taskset", "--cpu-list", cpu_list(split.every), "env", f"OMP_PLACES={places}", "OMP_PROC_BIND=close"]
    return prefix, len(split.decode), len(split.every)


def describe_llama_cpus(pid: int, split: CpuSplit) -> str:
    """What the kernel says of a running llama-server under the split: where it decodes and where it reads prompts.

    Its main thread decodes a lone reply (llama-server's task loop); the other compute threads join it for
    batches. A main thread outside the split's CPUs means the split did not take: said so, as a warning."""
    cpus = thread_cpus(pid)
    decode = cpus.get(pid, frozenset())
    batch = frozenset().union(*cpus.values()) if cpus else frozenset()
    if decode != split.decode:
        return (
            f"WARNING: llama-server's main thread may run on CPU {cpu_list(decode)}, not only on "
            f"CPU {cpu_list(split.decode)}: RIGDASH_DECODE_CPUS did not take"
        )
    return f"llama-server decodes on CPU {cpu_list(decode)} and reads prompts on CPU {cpu_list(batch)}"


def keep_off_decode_cpus(split: CpuSplit | None) -> None:
    """Move this process (and so every process it starts later) off llama-server's CPUs."""
    if split is not None:
        os.sched_setaffinity(0, split.rest)


def llama_server_command(*, port: int, slots: int, ctx: int, extra: Sequence[str] = ()) -> list[str]:
    binary = os.environ.get("LLAMA_SERVER_BIN", "")
    model = os.environ.get("LLAMA_MODEL_PATH", "")
    if not (binary and Path(binary).exists() and model and Path(model).exists()):
        raise SystemExit("LLAMA_SERVER_BIN / LLAMA_MODEL_PATH are not set: run scripts/build-llama-server first")
    split = cpu_split()
    # Decode is memory-bound: one thread fewer than the cores decodes as fast and leaves a core to RigDash and the
    # browser, whose CPU would otherwise come out of decoding. Prompt processing is compute-bound and keeps every
    # core (-tb), and so do several slots decoding at once: llama.cpp gives any batch of more than one token its
    # batch threads (docs/benchmarks.md).
    # With CPUs of its own (RIGDASH_DECODE_CPUS) it decodes on all of them, where nothing else runs (_split_launch).
    if split:
        pin, decode_threads, batch_threads = _split_launch(split, binary)
    else:
        cores = os.cpu_count() or 2
        pin, decode_threads, batch_threads = [], max(1, cores - 1), cores
    threads = os.environ.get("LLAMA_THREADS", str(decode_threads))
    threads_batch = os.environ.get("LLAMA_THREADS_BATCH", str(batch_threads))
    alias = os.environ.get("LLAMA_MODEL_ALIAS", "SmolLM2-135M-Instruct-Q4_1")
    return [
        *pin, binary, "-m", model, "--host", "127.0.0.1", "--port", str(port), "--metrics", "--slots",
        "-np", str(slots), "-c", str(ctx), "-t", threads, "-tb", threads_batch, "--alias", alias, "--no-webui",
        *extra,
    ]  # fmt: skip


def worker_command(*, queues: Sequence[str], concurrency: int, name: str, beat_schedule: Path | None) -> list[str]:
    """The Celery worker as RigDash runs it (scripts/run, the benchmark and the test suite's fixtures), with the
    beat embedded when ``beat_schedule`` is given.

    Without heartbeat, gossip and mingle: they exist for event monitors (Flower, ``celery events``) and for workers
    that watch one another, and RigDash uses none of them (its health check pings through the control mailbox,
    which stays). The heartbeat publishes an event every 2 s and gossip wakes the worker to read each one, the
    worker's own among them: most of an idle worker's Redis traffic.
    """
    beat = ["-B", "-s", str(beat_schedule)] if beat_schedule is not None else []
    return [
        PYTHON, "-m", "celery", "-A", "rigdash", "worker", *beat, "-Q", ",".join(queues), "-c", str(concurrency),
        "-l", "INFO", "-n", name, "--without-heartbeat", "--without-gossip", "--without-mingle",
    ]  # fmt: skip


def web_command(*, host: str, port: int) -> list[str]:
    """The web server as RigDash runs it (scripts/run, the benchmark and the test suite's fixtures; docker-compose.yml
    and the Dockerfile spell it out): uvicorn with RigDash's settings and a quiet main loop (rigdash/webserver.py)."""
    return [PYTHON, "-m", "rigdash.webserver", "--host", host, "--port", str(port)]


@dataclass
class Stack:
    """Processes started together and stopped together (SIGTERM, then SIGKILL after a grace period)."""

    procs: list[tuple[str, subprocess.Popen[bytes]]] = field(default_factory=list)

    def start(self, name: str, cmd: Sequence[str], *, env: dict[str, str] | None = None,
              log_path: Path | None = None, pass_fds: Sequence[int] = ()) -> subprocess.Popen[bytes]:  # fmt: skip
        out = open(log_path, "ab") if log_path else None  # noqa: SIM115 - lives as long as the process
        proc = subprocess.Popen(
            list(cmd),
            cwd=ROOT,
            env={**os.environ, **(env or {})},
            stdout=out,
            stderr=subprocess.STDOUT if out else None,
            start_new_session=True,
            pass_fds=tuple(pass_fds),
        )
        self.procs.append((name, proc))
        return proc

    def stop(self, grace_s: float = 8.0) -> None:
        for _, proc in reversed(self.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for _, proc in reversed(self.procs):
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.procs.clear()

    def first_exited(self) -> tuple[str, int] | None:
        for name, proc in self.procs:
            if proc.poll() is not None:
                return name, proc.returncode
        return None


def start_private_redis(stack: Stack, var_dir: Path, log_path: Path) -> tuple[str, subprocess.Popen[bytes]]:
    """A redis-server of our own on a free loopback port, keeping nothing on disk; its URL and process."""
    server = shutil.which("redis-server")
    if not server:
        raise SystemExit(
            "redis-server is not installed. Install it (Debian/Ubuntu: sudo apt-get install redis-server) "
            "or set REDIS_URL to a running Redis."
        )
    port = free_port()
    proc = stack.start(
        "redis",
        [server, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no", "--dir", str(var_dir)],
        log_path=log_path,
    )
    url = f"redis://127.0.0.1:{port}/0"
    deadline = time.monotonic() + 15
    while not redis_answers(url):
        if time.monotonic() > deadline or proc.poll() is not None:
            raise SystemExit(f"the private redis-server did not start; see {log_path}")
        time.sleep(0.1)
    return url, proc


def ensure_redis(stack: Stack, var_dir: Path) -> str:
    """REDIS_URL if it answers; else a private redis-server if one is installed; else stop with advice."""
    url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    if redis_answers(url):
        return url
    log(f"no Redis answers at {url}: starting a private redis-server")
    return start_private_redis(stack, var_dir, var_dir / "redis.log")[0]


def manage(*args: str, env: dict[str, str]) -> None:
    subprocess.run([PYTHON, "manage.py", *args], cwd=ROOT, env={**os.environ, **env}, check=True)


def run() -> int:
    var_dir = Path(os.environ.get("RIGDASH_VAR_DIR", ROOT / "var"))
    (var_dir / "log").mkdir(parents=True, exist_ok=True)
    host = os.environ.get("RIGDASH_HOST", "127.0.0.1")
    port = int(os.environ.get("RIGDASH_PORT", "8000"))
    llama_url = urlparse(os.environ.get("LLAMA_SERVER_URL", "http://127.0.0.1:8081"))
    llama_port = llama_url.port or 8081
    stack = Stack()
    # Ctrl-C and SIGTERM both stop everything. SIGINT is set explicitly: a shell that starts us in the
    # background leaves it ignored, and then Ctrl-C (or `kill -INT`) would do nothing.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        split = cpu_split()
        keep_off_decode_cpus(split)  # before anything starts: every process but llama-server inherits it

        share = share_for(split, log=log)
        if split:
            log(split.describe())
            if share:
                log(
                    "while several replies stream, RigDash's processes use every CPU"
                    " (RIGDASH_DECODE_CPUS_HOLD=always keeps them off the decode's)"
                )
            # A browser on the rig is the user's: it runs wherever it was started, the decode's CPUs included.
            log(
                f"a browser on this machine is not moved: start it with taskset --cpu-list {cpu_list(split.rest)}"
                " to keep it off the decode too"
            )
        env = {"REDIS_URL": ensure_redis(stack, var_dir), "LLAMA_SERVER_URL": llama_url.geturl()}
        for busy_port, what in ((port, "RIGDASH_PORT"), (llama_port, "LLAMA_SERVER_URL")):
            if port_open("127.0.0.1", busy_port):
                raise SystemExit(f"port {busy_port} is already in use: stop what holds it or set {what}")
        manage("migrate", "--noinput", "-v", "0", env=env)
        manage("rigdash_bootstrap", env=env)
        slots = int(os.environ.get("LLAMA_SLOTS", "4"))
        ctx = int(os.environ.get("LLAMA_CTX", "8192"))
        llama = stack.start(
            "llama-server", llama_server_command(port=llama_port, slots=slots, ctx=ctx),
            log_path=var_dir / "log" / "llama-server.log",
        )  # fmt: skip
        stack.start(
            "worker",
            worker_command(queues=["rig.embedded", "rigdash.default"], concurrency=slots, name="rigdash@%h",
                           beat_schedule=var_dir / "celerybeat-schedule"),
            env={**env, **(share.worker_env() if share else {})}, log_path=var_dir / "log" / "worker.log",
            pass_fds=share.pass_fds if share else (),
        )  # fmt: skip
        stack.start(
            "sampler", [PYTHON, "manage.py", "rigdash_sampler"], env=env, log_path=var_dir / "log" / "sampler.log"
        )
        web = stack.start(
            "web", web_command(host=host, port=port), env=env, log_path=var_dir / "log" / "web.log"
        )  # fmt: skip
        wait_http(f"{llama_url.geturl()}/health", timeout_s=120, proc=llama)
        if split:
            log(describe_llama_cpus(llama.pid, split))
        if share:  # RigDash's processes: everything started but llama-server
            share.watch([proc.pid for name, proc in stack.procs if name != "llama-server"])
        wait_http(f"http://127.0.0.1:{port}/static/rigdash/app.css", timeout_s=60, proc=web)
        log(f"RigDash is up: http://{host}:{port}/   (logs in {var_dir / 'log'}; Ctrl-C stops everything)")
        while (exited := stack.first_exited()) is None:
            time.sleep(0.5)
        log(f"{exited[0]} exited with code {exited[1]}; stopping the rest (see {var_dir / 'log'})")
        return 1
    except KeyboardInterrupt:
        log("stopping…")
        return 0
    finally:
        stack.stop()


if __name__ == "__main__":
    sys.exit(run())
