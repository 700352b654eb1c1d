"""Commit work collected for another thread (inference/aftercommit.py) keeps Django's own rules: only what committed
runs, in order; a robust hook's error is logged and the rest still run; another error stops the rest."""

from __future__ import annotations

import logging

import pytest
from django.db import transaction

from inference import aftercommit
from inference.models import Rig


def _rig(name: str) -> Rig:
    return Rig.objects.create(name=name, kind=Rig.Kind.LLAMACPP, base_url="http://127.0.0.1:9", queue=f"rig.{name}")


@pytest.mark.django_db(transaction=True)
def test_collected_work_is_kept_for_the_caller_and_only_what_committed():
    ran: list[str] = []
    with aftercommit.collected() as hooks:
        with transaction.atomic():
            _rig("kept")
            aftercommit.on_commit(lambda: ran.append("kept"))
        with pytest.raises(RuntimeError), transaction.atomic():
            _rig("rolled-back")
            aftercommit.on_commit(lambda: ran.append("rolled back"))
            raise RuntimeError("the transaction fails")
        with transaction.atomic():
            aftercommit.on_commit(lambda: ran.append("second"), robust=True)
    assert ran == []  # collected, not run
    assert [hook.robust for hook in hooks] == [False, True]
    aftercommit.run(hooks)
    assert ran == ["kept", "second"]
    assert list(Rig.objects.values_list("name", flat=True)) == ["kept"]


@pytest.mark.django_db(transaction=True)
def test_outside_collected_it_is_djangos_on_commit():
    ran: list[str] = []
    with transaction.atomic():
        aftercommit.on_commit(lambda: ran.append("now"))
        assert ran == []
    assert ran == ["now"]


def test_a_robust_hooks_error_is_logged_and_another_error_stops_the_rest(caplog):
    ran: list[str] = []

    def fails() -> None:
        raise ConnectionError("Redis went away")

    hooks = [
        aftercommit.Hook(fails, robust=True),
        aftercommit.Hook(lambda: ran.append("after the robust one"), robust=False),
        aftercommit.Hook(fails, robust=False),
        aftercommit.Hook(lambda: ran.append("never"), robust=True),
    ]
    with caplog.at_level(logging.ERROR, logger="inference.aftercommit"), pytest.raises(ConnectionError):
        aftercommit.run(hooks)
    assert ran == ["after the robust one"]
    assert [record.exc_info[0] for record in caplog.records if record.exc_info] == [ConnectionError]
