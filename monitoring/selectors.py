"""Reads for monitoring panels: time series for a range, the latest sample, recent per-token latency."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
from django.db import connection
from django.db.models import OuterRef, QuerySet, Subquery, TextField
from django.db.models.expressions import RawSQL
from django.db.models.functions import Cast
from django.utils import timezone

from inference.models import Rig
from inference.turns import selectors as turn_selectors
from monitoring import decode
from monitoring.models import RigSample
from monitoring.turn_metrics import draft_counts

RANGES_S = {"5m": 300, "15m": 900, "1h": 3600, "6h": 6 * 3600, "24h": 86400, "7d": 7 * 86400, "30d": 30 * 86400}
RAW_UP_TO_S = 6 * 3600
MAX_POINTS = 1500  # a chart is narrower than this in pixels


def rig_series(rig: Rig, range_s: int) -> dict[str, Any]:
    """Columns {ts: [...], series: {name: [...]}} over the whole range: raw samples up to 6 h, minutes beyond, and
    where the range holds more than MAX_POINTS of them, the first sample of each of MAX_POINTS equal buckets (the
    chart keeps its span, and the query reads the samples' JSON only for the points it draws)."""
    since = timezone.now() - timedelta(seconds=range_s)
    resolution = RigSample.RAW_S if range_s <= RAW_UP_TO_S else RigSample.DOWNSAMPLED_S
    thinned = range_s // resolution > MAX_POINTS
    step_s = math.ceil(range_s / MAX_POINTS / resolution) * resolution if thinned else resolution
    samples = RigSample.objects.filter(rig=rig, resolution_s=resolution, ts__gte=since)
    if thinned:
        samples = samples.filter(ts__in=_bucket_starts(samples, rig.pk, resolution, step_s, since))
    # The JSON as text, read by orjson: JSONField's json.loads was most of a long range's Python time.
    texts = samples.order_by("ts").values_list("ts", Cast("series", TextField()))
    rows = [(ts, orjson.loads(text)) for ts, text in texts]
    names = sorted({name for _, series in rows for name in series})
    # each sample's values in ``names`` order, then turned into one column per name (map and zip loop in C)
    columns = zip(*(list(map(series.get, names)) for _, series in rows), strict=True) if rows else iter(())
    return {
        "resolution_s": resolution,
        "step_s": step_s,
        "ts": [ts.timestamp() for ts, _ in rows],
        "series": {name: list(column) for name, column in zip(names, columns, strict=True)},
    }


def _bucket_starts(samples: QuerySet[RigSample], rig_id: int, resolution: int, step_s: int, since: datetime) -> Any:
    """The first sample time in each ``step_s`` bucket, named in SQL on PostgreSQL (a list of 1,500 times is as many
    parameters for the client to bind) and as a list elsewhere. Minute samples sit on whole minutes, so with a whole
    number of minutes per bucket that is each bucket's start (nothing read: ``generate_series``); raw ones are read
    from the index, times only (``DISTINCT ON`` the bucket)."""
    postgresql = connection.vendor == "postgresql"
    if resolution == RigSample.DOWNSAMPLED_S:
        first = math.ceil(since.timestamp() / step_s) * step_s
        now = int(timezone.now().timestamp())
        if postgresql:
            return RawSQL(
                "SELECT generate_series(to_timestamp(%s), to_timestamp(%s), make_interval(secs => %s))",
                [first, now, step_s],
            )
        return [datetime.fromtimestamp(t, tz=UTC) for t in range(first, now + 1, step_s)]
    if postgresql:  # the table's name is the one thing formatted in: the values are parameters
        return RawSQL(  # noqa: S611
            f"SELECT DISTINCT ON (floor(extract(epoch FROM ts) / %s)) ts FROM {RigSample._meta.db_table} "  # noqa: S608
            "WHERE rig_id = %s AND resolution_s = %s AND ts >= %s ORDER BY floor(extract(epoch FROM ts) / %s), ts",
            [step_s, rig_id, resolution, since, step_s],
        )
    chosen, bucket_at = [], None
    for ts in samples.order_by("ts").values_list("ts", flat=True):
        if (here := int(ts.timestamp() // step_s)) != bucket_at:
            chosen.append(ts)
            bucket_at = here
    return chosen


def rig_latest(rig: Rig) -> dict[str, Any] | None:
    return rigs_latest([rig]).get(rig.pk)


def rigs_latest(rigs: Iterable[Rig]) -> dict[int, dict[str, Any]]:
    """Each rig's newest raw sample: one query for one rig, two whatever the number of rigs (an index probe each)."""
    rigs = list(rigs)
    if len(rigs) == 1:
        one = RigSample.objects.filter(rig=rigs[0], resolution_s=RigSample.RAW_S).order_by("-ts").first()
        return (
            {} if one is None else {one.rig_id: {"ts": one.ts.timestamp(), "series": one.series, "detail": one.detail}}
        )
    newest = RigSample.objects.filter(rig=OuterRef("pk"), resolution_s=RigSample.RAW_S).order_by("-ts").values("pk")
    ids = Rig.objects.filter(pk__in=[rig.pk for rig in rigs]).annotate(latest=Subquery(newest[:1]))
    chosen = [pk for pk in ids.values_list("latest", flat=True) if pk is not None]
    return {
        rig_id: {"ts": ts.timestamp(), "series": series, "detail": detail}
        for rig_id, ts, series, detail in RigSample.objects.filter(pk__in=chosen).values_list(
            "rig_id", "ts", "series", "detail"
        )
    }


def rig_latency(rig: Rig, *, turns: int = 20, own_turns_of: int | None = None) -> dict[str, Any]:
    """Inter-token gaps and TTFT of the rig's most recent finished turns, with gap percentiles, and the draft
    tokens their speculative decoding accepted (llama-server's per-reply counts). ``own_turns_of``: a user who is
    not staff, who sees per-turn timings of their own turns only; the percentiles and the speculative totals stay
    over everyone's, which no single turn can be read back from."""
    recent = turn_selectors.rig_recent_finished(rig.pk, limit=turns)
    gaps: list[float] = []
    per_turn = []
    drafted = accepted = drafted_turns = 0
    for row in recent:
        if (drafts := draft_counts(row["stats"])) is not None:
            drafted, accepted, drafted_turns = drafted + drafts[0], accepted + drafts[1], drafted_turns + 1
        turn_gaps = [float(g) for g in row["stats"].get("inter_token_gaps_ms") or []]
        gaps.extend(turn_gaps)
        if own_turns_of is not None and row["owner_id"] != own_turns_of:
            continue
        per_turn.append(
            {
                "id": row["id"],
                "finished_at": row["finished_at"].timestamp() if row["finished_at"] else None,
                "ttft_ms": row["stats"].get("ttft_ms"),
                "decode_tps": row["stats"].get("decode_tps"),
                "gaps_ms": turn_gaps,
                "draft_acceptance": drafts[1] / drafts[0] if drafts else None,
            }
        )
    return {
        "turns": per_turn,
        "p50_ms": decode.percentile(gaps, 50),
        "p95_ms": decode.percentile(gaps, 95),
        "p99_ms": decode.percentile(gaps, 99),
        "gap_count": len(gaps),
        "speculative": {
            "turns": len(recent),
            "drafted_turns": drafted_turns,
            "drafted": drafted,
            "accepted": accepted,
            "acceptance": accepted / drafted if drafted else None,
        },
    }


# What an ordinary user reads where a figure's source failed: the rig's name is on the page; the detail (URLs,
# host names, file paths, exception text) is for staff (docs/reliability.md).
PLAIN_SOURCE_REASONS = {
    "backend": "the backend could not be reached or answered something RigDash cannot read",
    "kv": "the model's memory layout is not known yet",
    "queue": "RigDash could not read this rig's queue",
}
NOT_MEASURED = "not measured for this rig"


def redact_users(sample: dict[str, Any], *, viewer: str, is_staff: bool) -> dict[str, Any]:
    """A sample as a viewer may see it. Staff: whole. Ordinary users: their own turns by name and others' only as
    "another user"; no backend detail: a failed source's error is a plain reason, the model a name (not its file's
    path on the host), the agent up or down (not its host), no backend process, no placement's why."""
    if is_staff:
        return sample
    detail = dict(sample.get("detail") or {})
    detail["turns"] = [
        {**turn, "user": turn["user"] if turn.get("user") == viewer else "another user"}
        for turn in detail.get("turns", [])
    ]
    detail["sources"] = {
        name: source if source.get("ok") else {"ok": False, "error": PLAIN_SOURCE_REASONS.get(name, NOT_MEASURED)}
        for name, source in (detail.get("sources") or {}).items()
        if isinstance(source, dict)
    }
    if isinstance(model := detail.get("model"), str):
        detail["model"] = ", ".join(_model_name(name.strip()) for name in model.split(","))
    if isinstance(agent := detail.get("agent"), dict):
        detail["agent"] = _plain_agent(agent)
    detail.pop("process", None)
    if isinstance(placement := detail.get("placement"), dict) and placement.get("why"):
        why = placement["why"]
        placement = {key: value for key, value in placement.items() if key != "why"}
        placement["label"] = str(placement.get("label", "")).replace(f" ({why})", "")
        detail["placement"] = placement
    return {**sample, "detail": detail}


_PATH = re.compile(r"^(/|~|[A-Za-z]:[\\/])|\.gguf$", re.IGNORECASE)


def _model_name(name: str) -> str:
    """A model file's name without its directories (llama-server names its model by its path when it has no
    alias); an Ollama name such as ``user/model:tag`` stays whole."""
    return re.split(r"[\\/]", name)[-1] if _PATH.search(name) else name


def _plain_agent(agent: dict[str, Any]) -> dict[str, Any]:
    plain = {key: agent.get(key) for key in ("expected", "up", "last_seen")}
    if not agent.get("expected"):
        label = "no agent"
    elif agent.get("error"):
        label = "agent rejected: what it sent does not count"
    elif agent.get("up"):
        label = "agent up"
    else:
        label = str(agent.get("label", "agent down"))  # "down since <time>" or "never reported": no host in it
    return {**plain, "label": label}
