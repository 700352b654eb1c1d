"""Writes for alerts: evaluating rules on each sample (with hysteresis), firing and resolving alerts and queueing
their deliveries, and the staff's acknowledge and silence.

Evaluation runs in the sampler process, on the thread that stores each sample (``monitoring.sampler``): rules are
read at most every RULES_TTL_S, a rig's turn figures at most every FIGURES_TTL_S, and a sample whose rules hold no
change costs no write. Deliveries go to a thread pool (``alerts.delivery``), so a slow webhook never delays a
sample. Hysteresis (``conditions.step``) lives in this process's memory: a sampler that restarts starts each
rule's clock again, and finds the alerts still firing in the database.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import IntegrityError, transaction
from django.utils import timezone

from inference.audit import audit_record
from inference.errors import InvalidInput, NotFound
from inference.models import Rig
from monitoring.alerts import conditions, delivery, selectors
from monitoring.alerts.models import Alert, AlertChannel, AlertRule, Delivery, Silence

log = logging.getLogger(__name__)
RULES_TTL_S = 2.0
FIGURES_TTL_S = 5.0
NEEDS_TURNS = {AlertRule.Kind.QUEUE_WAIT_P95, AlertRule.Kind.ERROR_RATE}
RIGLESS = {AlertRule.Kind.DISK}  # about RigDash's own host: one alert, not one per rig


def _deliveries_queue(alert: Alert, event: str, now: datetime) -> list[int]:
    """A delivery row per enabled channel (silenced where a silence covers the alert); sent after the commit."""
    silenced = any(s.covers(alert, now) for s in selectors.silences_active(now))
    status = Delivery.Status.SILENCED if silenced else Delivery.Status.PENDING
    rows = Delivery.objects.bulk_create(
        Delivery(alert=alert, channel=channel, event=event, status=status)
        for channel in AlertChannel.objects.filter(enabled=True)
    )
    ids = [row.pk for row in rows if row.status == Delivery.Status.PENDING]
    transaction.on_commit(lambda: delivery.deliveries_send(ids))
    return ids


def alert_fire(*, rule: AlertRule, rig_id: int | None, reading: conditions.Reading, since: datetime) -> Alert | None:
    """Store a firing alert and queue its deliveries; None when one is firing already for the rule and rig."""
    now = timezone.now()
    try:
        with transaction.atomic():
            alert = Alert.objects.create(rule=rule, rig_id=rig_id, value=reading.value, message=reading.message,
                                         condition_since=since, fired_at=now)  # fmt: skip
            alert.rule = rule
            _deliveries_queue(alert, Alert.State.FIRING, now)
    except IntegrityError:
        return None
    log.warning("alert %s fired: %s on rig %s: %s", alert.pk, rule.name, rig_id, reading.message)
    return alert


def alert_resolve(*, alert_id: int, reading: conditions.Reading | None = None) -> bool:
    """Mark a firing alert resolved once and queue the "resolved" deliveries."""
    now = timezone.now()
    with transaction.atomic():
        changes: dict[str, Any] = {"state": Alert.State.RESOLVED, "resolved_at": now}
        if reading is not None:
            changes["message"] = reading.message
        if Alert.objects.filter(pk=alert_id, state=Alert.State.FIRING).update(**changes) != 1:
            return False
        alert = Alert.objects.select_related("rule", "rig").get(pk=alert_id)
        _deliveries_queue(alert, Alert.State.RESOLVED, now)
    log.warning("alert %s resolved: %s", alert_id, alert.message)
    return True


@dataclass
class Evaluator:
    """Every rule over each rig's samples, one rig's sample at a time (the sampler's database thread)."""

    tracks: dict[tuple[int, int | None], conditions.Track] = field(default_factory=dict)
    rules: list[AlertRule] = field(default_factory=list)
    firing: dict[tuple[int, int | None], int] = field(default_factory=dict)
    rules_read_at: float = float("-inf")
    figures: dict[tuple[int, int], tuple[float, dict[str, Any]]] = field(default_factory=dict)
    disk: tuple[float, float | None] = (float("-inf"), None)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def refresh(self, now_mono: float) -> None:
        if now_mono - self.rules_read_at < RULES_TTL_S:
            return
        self.rules = list(AlertRule.objects.filter(enabled=True))
        self.firing = {(a.rule_id, a.rig_id): a.pk for a in Alert.objects.filter(state=Alert.State.FIRING)}
        self.rules_read_at = now_mono

    def _turn_figures(self, rig_id: int, window_s: int, now_mono: float) -> dict[str, Any]:
        at, figures = self.figures.get((rig_id, window_s), (float("-inf"), {}))
        if now_mono - at >= FIGURES_TTL_S:
            figures = selectors.rig_turn_figures(rig_id=rig_id, window_s=window_s, now=timezone.now())
            self.figures[(rig_id, window_s)] = (now_mono, figures)
        return figures

    def _disk(self, now_mono: float) -> float | None:
        if now_mono - self.disk[0] >= FIGURES_TTL_S:
            try:
                self.disk = (now_mono, selectors.disk_used_pct())
            except OSError:
                self.disk = (now_mono, None)
        return self.disk[1]

    def sample_evaluate(
        self, *, rig: Rig, series: Mapping[str, Any], detail: Mapping[str, Any], now: float | None = None
    ) -> list[tuple[str, int]]:
        """Step every enabled rule that covers ``rig`` with this sample; returns [("fire" | "resolve", alert id)]."""
        now_mono = time.monotonic()
        now = time.time() if now is None else now
        done: list[tuple[str, int]] = []
        with self.lock:
            self.refresh(now_mono)
            for rule in self.rules:
                if rule.rig_id is not None and rule.rig_id != rig.pk and rule.kind not in RIGLESS:
                    continue
                rig_id = None if rule.kind in RIGLESS else rig.pk
                facts = conditions.Facts(series=series, detail=detail, has_agent=bool(rig.agent_key))
                if rule.kind in NEEDS_TURNS:
                    facts = conditions.Facts(series=series, detail=detail, has_agent=bool(rig.agent_key),
                                             **self._turn_figures(rig.pk, rule.window_s, now_mono))  # fmt: skip
                elif rule.kind in RIGLESS:
                    facts = conditions.Facts(series=series, detail=detail, disk_used_pct=self._disk(now_mono))
                reading = conditions.CONDITIONS[rule.kind](facts, rule.threshold)
                key = (rule.pk, rig_id)
                track = self.tracks.setdefault(key, conditions.Track())
                firing = key in self.firing
                change = conditions.step(track, bad=reading.bad, firing=firing, now=now, for_s=rule.for_s,
                                         clear_s=rule.clear_s)  # fmt: skip
                if change == "fire" and track.bad_since is not None:
                    since = datetime.fromtimestamp(track.bad_since, tz=UTC)
                    alert = alert_fire(rule=rule, rig_id=rig_id, reading=reading, since=since)
                    if alert is not None:
                        self.firing[key] = alert.pk
                        done.append(("fire", alert.pk))
                elif change == "resolve":
                    alert_id = self.firing.pop(key)
                    if alert_resolve(alert_id=alert_id, reading=reading):
                        done.append(("resolve", alert_id))
        return done


evaluator = Evaluator()


def sample_evaluate(*, rig: Rig, series: Mapping[str, Any], detail: Mapping[str, Any]) -> None:
    """The sampler's hook: never raises, so alerts cannot stop sampling."""
    try:
        evaluator.sample_evaluate(rig=rig, series=series, detail=detail)
    except Exception:
        log.exception("evaluating alert rules on rig %s's sample failed", rig.pk)


# Staff actions -----------------------------------------------------------------------------------------


def alert_acknowledge(*, actor: AbstractBaseUser | AnonymousUser, alert_id: int) -> None:
    updated = Alert.objects.filter(pk=alert_id, acknowledged_at__isnull=True).update(
        acknowledged_at=timezone.now(), acknowledged_by_id=actor.pk
    )
    if not updated and not Alert.objects.filter(pk=alert_id).exists():
        raise NotFound("alert")
    audit_record(actor=actor, action="alert.acknowledge", target=f"alert:{alert_id}")


def silence_create(
    *, actor: AbstractBaseUser | AnonymousUser, rule_id: int | None, rig_id: int | None, minutes: int, reason: str
) -> Silence:
    if not 1 <= minutes <= 60 * 24 * 30:
        raise InvalidInput("bad_duration", "A silence lasts 1 minute to 30 days.")
    silence = Silence.objects.create(rule_id=rule_id, rig_id=rig_id, reason=reason[:200], created_by_id=actor.pk,
                                     until=timezone.now() + timedelta(minutes=minutes))  # fmt: skip
    audit_record(actor=actor, action="alert.silence", target=f"silence:{silence.pk}",
                 detail={"rule": rule_id, "rig": rig_id, "minutes": minutes})  # fmt: skip
    return silence


def silence_end(*, actor: AbstractBaseUser | AnonymousUser, silence_id: int) -> None:
    if not Silence.objects.filter(pk=silence_id, until__gt=timezone.now()).update(until=timezone.now()):
        raise NotFound("silence")
    audit_record(actor=actor, action="alert.unsilence", target=f"silence:{silence_id}")
