"""RigDash's long-running processes keep what they load out of full garbage collections (rigdash/gcpolicy.py): a
full collection of a web process holding hundreds of sockets stopped its event loop for about 100 ms."""

from __future__ import annotations

import gc
import re

import pytest

from rigdash import gcpolicy
from tests.conftest import LOG_DIR, wait_until

SETTLED = re.compile(r"(web|worker|sampler): (\d+) objects moved to the permanent generation")


def test_settle_moves_what_the_process_holds_out_of_collections():
    kept = [[n] for n in range(20_000)]  # lists are tracked by the collector
    try:
        frozen = gcpolicy.settle("test")
        assert frozen == gc.get_freeze_count() >= len(kept)
        gc.collect()
        assert gc.get_freeze_count() == frozen  # a full collection leaves the permanent generation alone
    finally:
        gc.unfreeze()
    assert gc.get_freeze_count() == 0


@pytest.mark.django_db(transaction=True)
def test_the_web_server_the_worker_and_the_sampler_settle_once_started(web_url, celery_worker, sampler_process):
    def settled() -> dict[str, int]:
        found = {}
        for name in ("web.log", "worker.log", "sampler.log"):
            path = LOG_DIR / name
            for match in SETTLED.finditer(path.read_text(errors="replace") if path.exists() else ""):
                found[match.group(1)] = int(match.group(2))
        return found

    wait_until(lambda: len(settled()) == 3, timeout_s=30, what="each process's settle line in its log")
    assert all(count > 50_000 for count in settled().values()), settled()  # Django and its apps, not a handful
