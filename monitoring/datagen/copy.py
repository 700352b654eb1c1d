"""Bulk writes through PostgreSQL's COPY, with ids taken from each table's own sequence."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from django.db import connection

# Columns the generator leaves at their model default: what Django would write for a row created without them.
DEFAULTS: dict[str, dict[str, Any]] = {
    "inference_turn": {"thinking_text": ""},
    "inference_chatsession": {"settings": "{}", "placement": "rig", "hidden": False},
}


def copy_rows(table: str, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> int:
    """COPY ``rows`` into ``table``; JSON columns take their values as already-encoded strings. Columns in
    ``DEFAULTS`` that ``columns`` does not name are written with their default."""
    extra = {name: value for name, value in DEFAULTS.get(table, {}).items() if name not in columns}
    count = 0
    with connection.cursor() as cursor:
        raw = cursor.cursor  # the psycopg cursor under Django's wrapper
        with raw.copy(f"COPY {table} ({', '.join([*columns, *extra])}) FROM STDIN") as copy:
            tail = tuple(extra.values())
            for row in rows:
                copy.write_row((*row, *tail))
                count += 1
    return count


def reserve_ids(table: str, count: int) -> int:
    """The first of ``count`` consecutive ids, taken from the table's id sequence (so later inserts never
    collide with the rows written with them)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_get_serial_sequence(%s, 'id')", [table])
        sequence = cursor.fetchone()[0]
        cursor.execute(f"SELECT COALESCE(MAX(id), 0) FROM {table}")  # noqa: S608 (a table name of this module's callers)
        floor = int(cursor.fetchone()[0])
        cursor.execute("SELECT nextval(%s)", [sequence])
        first = max(int(cursor.fetchone()[0]), floor + 1)
        cursor.execute("SELECT setval(%s, %s)", [sequence, first + max(count, 1) - 1])
    return first


def analyze(tables: Iterable[str]) -> None:
    """VACUUM (ANALYZE) each table, as autovacuum leaves a table some time after a load: its visibility map set, so a
    covering index answers alone (an index-only scan) as it does in a database that has run a while. Inside a
    transaction (the tests), where VACUUM cannot run, ANALYZE."""
    command = "ANALYZE" if connection.in_atomic_block else "VACUUM (ANALYZE)"
    with connection.cursor() as cursor:
        for table in tables:
            cursor.execute(f"{command} {table}")
