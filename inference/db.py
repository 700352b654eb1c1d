"""Database helpers shared by every layer: row locks that work on PostgreSQL and SQLite, and the worker's write gate."""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

from django.db import connection
from django.db.models import Model, QuerySet

M = TypeVar("M", bound=Model)
P = ParamSpec("P")
R = TypeVar("R")


def locking(queryset: QuerySet[M]) -> QuerySet[M]:
    """The queryset, reading its own table's rows ``FOR UPDATE`` (inside a transaction). Not on SQLite, which has
    no row locks: there a transaction holds the database's write lock from its BEGIN (``transaction_mode``
    IMMEDIATE in settings), so the clause would only cost time."""
    return queryset.select_for_update(of=("self",)) if connection.features.has_select_for_update else queryset


def lock_rows(queryset: QuerySet[Any]) -> None:
    """Lock the rows (see ``locking``); on SQLite this issues nothing."""
    if connection.features.has_select_for_update:
        list(locking(queryset).values_list("pk", flat=True))


# SQLite lets one connection write at a time, and a connection that finds the lock taken sleeps in SQLite's busy
# handler (1 to 100 ms between tries) however soon the lock is free again. So this process's own writes queue on a
# lock that hands over at once, and SQLite's handler only arbitrates between processes. Databases with row locks
# go ungated.
_write_lock = threading.Lock()
_ungated = contextlib.nullcontext()


def _gate() -> threading.Lock | contextlib.nullcontext[None]:
    return _write_lock if connection.vendor == "sqlite" else _ungated


def gated(fn: Callable[P, R]) -> Callable[P, R]:
    """``fn``, run under this process's write gate (see ``_gate``)."""

    @functools.wraps(fn)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        with _gate():
            return fn(*args, **kwargs)

    return run
