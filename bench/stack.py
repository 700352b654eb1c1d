"""The benchmark's own RigDash: Redis, database, llama-server, tap, synthetic source, worker and web server.

Everything runs on free ports of 127.0.0.1 with its own database (SQLite under the run's directory unless
``--database-url``), its own Redis (a private redis-server unless ``--redis-url``) and its own channel
prefix, so a RigDash a person is running is never touched. Processes are started with the launcher's
helpers (``rigdash.launcher.Stack``, ``llama_server_command``), the way ``scripts/run`` starts them.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from bench import stats
from rigdash.cpushare import CpuShare, share_for
from rigdash.launcher import (
    ROOT,
    Stack,
    cpu_split,
    describe_llama_cpus,
    free_port,
    llama_server_command,
    port_open,
    start_private_redis,
    wait_http,
    web_command,
    worker_command,
)

PYTHON = sys.executable
LLAMA_QUEUE = "rig.bench-llama"
SYNTH_QUEUE = "rig.bench-synthetic"


SLOTS, CTX_PER_SLOT = 4, 2304


def bench_llama_command(port: int, slots: int = SLOTS, ctx_per_slot: int = CTX_PER_SLOT) -> list[str]:
    """llama-server as the benchmark runs it: ``slots`` slots of ``ctx_per_slot`` tokens, and ``--no-cache-prompt`` so
    that a direct read and a RigDash turn of the same prompt both process it in full."""
    return llama_server_command(port=port, slots=slots, ctx=slots * ctx_per_slot, extra=["--no-cache-prompt"])


@dataclass
class BenchStack:
    var_dir: Path
    flush_ms: int | None = None
    flush_min_ms: int | None = None
    database_url: str | None = None
    redis_url: str | None = None
    slots: int = SLOTS
    ctx_per_slot: int = CTX_PER_SLOT
    worker_concurrency: int = 16
    llama: bool = True  # False: no llama-server and no tap (the synthetic source alone: bench/scale.py)
    web_processes: int = 1  # web servers sharing the channel layer, on ports web, web2, ...
    synthetic_rigs: int = 1  # ports the synthetic source serves, one rig each (``synthetic``, ``synthetic2``, ...)
    synthetic_busy_rate: float = 0.0  # bench.synthetic --busy-rate: each port's extra slot always decoding
    sampler: bool = True
    extra_env: dict[str, str] = field(default_factory=dict)
    stack: Stack = field(default_factory=Stack)
    env: dict[str, str] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)
    pids: dict[str, int] = field(default_factory=dict)
    llama_cpus: str | None = None  # under a CPU split, where the kernel says llama-server decodes and reads prompts
    cpu_share: CpuShare | None = None  # under a CPU split that holds while one reply streams

    @property
    def log_dir(self) -> Path:
        return self.var_dir / "log"

    @property
    def web_port(self) -> int:
        return self.ports["web"]

    def start(self, log: Any = print) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        redis_url = self.redis_url or self._private_redis()
        database_url = self.database_url or f"sqlite:///{self.var_dir / 'bench.sqlite3'}"
        self.env = {
            "DATABASE_URL": database_url,
            "REDIS_URL": redis_url,
            "CELERY_BROKER_URL": redis_url,
            "RIGDASH_VAR_DIR": str(self.var_dir),
            "RIGDASH_SECRET_KEY": secrets.token_urlsafe(40),
            "RIGDASH_CHANNEL_PREFIX": f"rigdash-bench-{os.getpid()}",  # pub/sub channels ignore the db number
            "RIGDASH_MAX_REPLY_TOKENS": "8192",
            "RIGDASH_DEFAULT_QUEUE": f"rigdash.bench-default-{os.getpid()}",
            "RIGDASH_ALLOWED_HOSTS": "127.0.0.1,localhost",
            # One bench user drives every tab: the per-user frame rate limit is for people, not the swarm.
            "RIGDASH_WS_FRAMES_PER_S": "100000",
        }
        self.env.update(self.extra_env)
        if self.flush_ms is not None:
            self.env["RIGDASH_FLUSH_INTERVAL_MS"] = str(self.flush_ms)
        if self.flush_min_ms is not None:
            self.env["RIGDASH_FLUSH_MIN_INTERVAL_MS"] = str(self.flush_min_ms)
        log(f"database {database_url.split('@')[-1]}, redis {redis_url}")
        subprocess.run(
            [PYTHON, "manage.py", "migrate", "--noinput", "-v", "0"],
            cwd=ROOT,
            env={**os.environ, **self.env},
            check=True,
        )
        for name in ("llama", "tap", "web") if self.llama else ("web",):
            self.ports[name] = free_port()
        for i in range(2, self.web_processes + 1):
            self.ports[f"web{i}"] = free_port()
        for i in range(1, self.synthetic_rigs + 1):
            self.ports["synthetic" if i == 1 else f"synthetic{i}"] = free_port()
        llama = None
        if self.llama:
            llama = self.stack.start(
                "llama-server",
                bench_llama_command(self.ports["llama"], self.slots, self.ctx_per_slot),
                log_path=self.log_dir / "llama-server.log",
            )
            self.pids["llama"] = llama.pid
            self.pids["tap"] = self.stack.start(
                "tap",
                [PYTHON, "-m", "bench.tap", "--port", str(self.ports["tap"]), "--upstream", str(self.ports["llama"])],
                log_path=self.log_dir / "tap.log",
            ).pid
        ports_file = self.var_dir / "synthetic-ports"
        ports_file.write_text("\n".join(str(port) for port in self.synthetic_ports()))
        self.pids["synthetic"] = self.stack.start(
            "synthetic",
            [PYTHON, "-m", "bench.synthetic", "--ports-file", str(ports_file),
             "--slots", str(max(16, self.worker_concurrency)), "--busy-rate", str(self.synthetic_busy_rate)],
            log_path=self.log_dir / "synthetic.log",
        ).pid  # fmt: skip
        # Under the split, RigDash's processes (and the benchmark's stand-ins on the backend's side: the tap, the
        # synthetic source) use every CPU while several replies stream, as the launcher's do (rigdash/cpushare.py).
        split = cpu_split()
        share = self.cpu_share = share_for(split, log=log)
        worker = self.stack.start(
            "worker",
            worker_command(
                queues=[LLAMA_QUEUE, SYNTH_QUEUE, self.env["RIGDASH_DEFAULT_QUEUE"]],
                concurrency=self.worker_concurrency,
                name=f"bench{os.getpid()}@%h",
                beat_schedule=self.var_dir / "celerybeat-schedule",
            ),
            env={**self.env, **(share.worker_env() if share else {})},
            log_path=self.log_dir / "worker.log",
            pass_fds=share.pass_fds if share else (),
        )
        self.pids["worker"] = worker.pid
        webs = []
        for name in self.web_names():
            web = self.stack.start(
                name,
                web_command(host="127.0.0.1", port=self.ports[name]),
                env=self.env,
                log_path=self.log_dir / f"{name}.log",
            )
            self.pids[name] = web.pid
            webs.append((name, web))
        if self.sampler:
            # The monitoring sampler, as scripts/run starts it: it feeds the dashboard viewers of level 2, and its
            # CPU counts as RigDash's.
            sampler = self.stack.start(
                "sampler", [PYTHON, "manage.py", "rigdash_sampler"], env=self.env, log_path=self.log_dir / "sampler.log"
            )
            self.pids["sampler"] = sampler.pid
        if llama is not None:
            wait_http(f"http://127.0.0.1:{self.ports['llama']}/health", timeout_s=180, proc=llama)
        if split and llama is not None:
            self.llama_cpus = describe_llama_cpus(llama.pid, split)
            log(self.llama_cpus)
        if share:
            share.watch([pid for name, pid in self.pids.items() if name != "llama"])
        for name, web in webs:
            wait_http(f"http://127.0.0.1:{self.ports[name]}/static/rigdash/app.css", timeout_s=120, proc=web)
        for port in ([self.ports["tap"]] if self.llama else []) + self.synthetic_ports():
            _wait_port(port, 30)
        self._wait_worker(worker, timeout_s=180)

    def web_names(self) -> list[str]:
        return ["web"] + [f"web{i}" for i in range(2, self.web_processes + 1)]

    def synthetic_ports(self) -> list[int]:
        return [self.ports["synthetic" if i == 1 else f"synthetic{i}"] for i in range(1, self.synthetic_rigs + 1)]

    def _private_redis(self) -> str:
        url, proc = start_private_redis(self.stack, self.var_dir, self.log_dir / "redis.log")
        self.pids["redis"] = proc.pid
        return url

    def _wait_worker(self, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
        log_path = self.log_dir / "worker.log"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"the worker exited ({proc.returncode}); see {log_path}")
            if log_path.exists() and " ready." in log_path.read_text(errors="replace"):
                return
            time.sleep(0.3)
        raise TimeoutError(f"the worker was not ready within {timeout_s:g} s; see {log_path}")

    def django_setup(self) -> None:
        """Point this process's Django at the bench database and Redis (for users, rigs and sessions)."""
        os.environ.update(self.env)
        os.environ["DJANGO_SETTINGS_MODULE"] = "rigdash.settings"
        os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"  # short ORM calls between measured windows
        import django

        django.setup()

    # --- objects -----------------------------------------------------------------------------------------

    def prepare(self) -> dict[str, Any]:
        import httpx
        from django.conf import settings
        from django.contrib.auth import get_user_model
        from django.test import Client

        from inference.models import Rig

        user = get_user_model().objects.create_user(username="bench", password=secrets.token_urlsafe(16))
        rigs: dict[str, Rig] = {}
        llama_model = ""
        if self.llama:
            models = httpx.get(f"http://127.0.0.1:{self.ports['llama']}/v1/models", timeout=10).json()
            llama_model = models["data"][0]["id"]
            rigs["llama"] = Rig.objects.create(
                name="bench-llama",
                kind=Rig.Kind.LLAMACPP,
                base_url=f"http://127.0.0.1:{self.ports['tap']}",
                queue=LLAMA_QUEUE,
                slots=self.slots,  # RigDash's fair queue hands llama-server as many turns as it has slots
            )
        rigs["synthetic"] = Rig.objects.create(
            name="bench-synthetic",
            kind=Rig.Kind.LLAMACPP,
            base_url=f"http://127.0.0.1:{self.ports['synthetic']}",
            queue=SYNTH_QUEUE,
            slots=self.worker_concurrency,  # the synthetic source has at least as many slots
        )
        client = Client()
        client.force_login(user)
        cookie = f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"
        self._user, self._rigs = user, rigs
        self._models = {"llama": llama_model, "synthetic": "synthetic"}
        return {
            "cookie": cookie,
            "cookie_value": client.cookies[settings.SESSION_COOKIE_NAME].value,
            "llama_model": llama_model,
        }

    def rig_id(self, rig: str) -> int:
        return int(self._rigs[rig].pk)

    def new_session(self, rig: str) -> int:
        from inference.models import ChatSession

        return int(ChatSession.objects.create(owner=self._user, rig=self._rigs[rig], model_name=self._models[rig]).pk)

    def stored_turn(self, turn_id: int) -> dict[str, Any]:
        from inference.models import Turn

        turn = Turn.objects.get(pk=turn_id)
        return {
            "reply": turn.reply_text,
            "status": turn.status,
            "finish_reason": turn.finish_reason,
            "stats": turn.stats,
            "error": turn.error,
            "created_at": turn.created_at.timestamp(),
            "started_at": turn.started_at.timestamp() if turn.started_at else None,
        }

    # --- what RigDash costs ------------------------------------------------------------------------------

    def cpu(self) -> dict[str, float]:
        """CPU seconds so far per process tree: RigDash's (web; worker and its children; sampler) and the others
        the benchmark started (llama-server, tap, synthetic source, Chromium when a tab is open)."""
        out: dict[str, float] = {}
        for role, pid in self.pids.items():
            if role == "redis":
                continue
            try:
                proc = psutil.Process(pid)
                procs = [proc, *proc.children(recursive=True)]
            except psutil.Error:
                continue
            times = []
            for p in procs:
                try:
                    t = p.cpu_times()
                    times.append((t.user, t.system))
                except psutil.Error:
                    continue
            out[role] = stats.cpu_seconds(times)
        return out

    def redis_calls(self) -> dict[str, int]:
        import redis

        client = redis.Redis.from_url(self.env["REDIS_URL"])
        try:
            info = client.info("commandstats")
            assert isinstance(info, dict)  # a sync client: redis-py types it as maybe awaitable
            return stats.command_calls(info)
        finally:
            client.close()

    def stop(self) -> None:
        self.stack.stop()


def _wait_port(port: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not port_open("127.0.0.1", port):
        if time.monotonic() > deadline:
            raise TimeoutError(f"nothing listens on 127.0.0.1:{port}")
        time.sleep(0.1)
