"""Pure pieces: decode arithmetic, the live-list snapshot, settings readers, the deploy checks."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from django.core.exceptions import ImproperlyConfigured

from inference.live.state import decode_snapshot, encode_batch
from inference.worker.pace import StreamMeter
from rigdash.env import env_bool, env_int
from rigdash.launcher import ROOT


def test_decode_rate_excludes_the_prompt_phase():
    meter = StreamMeter(t_request=0.0)
    for t in (1.0, 1.01, 1.02, 1.03, 1.04):  # first token after 1 s of prompt, then 10 ms gaps
        meter.token(t)
    assert meter.ttft_ms == 1000.0
    assert meter.decode_tps == pytest.approx(100.0)
    assert meter.gaps_ms == pytest.approx([10.0, 10.0, 10.0, 10.0])
    single = StreamMeter(t_request=0.0)
    single.token(0.5)
    assert single.decode_tps is None


def test_snapshot_joins_batches_and_reports_the_last_seq():
    batches = [encode_batch(1, 1, "Hé"), encode_batch(2, 4, "llo 🌊"), encode_batch(5, 5, "!")]
    snapshot = decode_snapshot(batches)
    assert snapshot.text == "Héllo 🌊!" and snapshot.seq == 5
    assert decode_snapshot([]).seq == 0
    with pytest.raises(ValueError):
        decode_snapshot([encode_batch(1, 1, "a"), encode_batch(3, 3, "c")])


def test_env_readers_fail_loudly(monkeypatch):
    monkeypatch.setenv("X_INT", "12x")
    with pytest.raises(ImproperlyConfigured, match="X_INT"):
        env_int("X_INT", 1)
    monkeypatch.setenv("X_INT", "0")
    with pytest.raises(ImproperlyConfigured):
        env_int("X_INT", 1, minimum=1)
    monkeypatch.setenv("X_BOOL", "maybe")
    with pytest.raises(ImproperlyConfigured):
        env_bool("X_BOOL", False)
    monkeypatch.setenv("X_BOOL", "yes")
    assert env_bool("X_BOOL", False) is True


def test_check_deploy_is_clean_with_production_settings(tmp_path):
    env = {
        **{k: v for k, v in os.environ.items() if k != "DJANGO_ALLOW_ASYNC_UNSAFE"},
        "RIGDASH_SECURE": "1",
        "RIGDASH_TRUSTED_PROXIES": "127.0.0.1",
        "RIGDASH_SECRET_KEY": "a-long-random-production-secret-" + "k" * 40,
        "RIGDASH_VAR_DIR": str(tmp_path),
    }
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT, env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout
