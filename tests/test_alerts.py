"""Alerts: each rule kind's condition, hysteresis (no flapping), delivery to a real HTTP receiver and a real SMTP
server started by the test (webhook, ntfy, Slack, Discord, email), retries, silences, acknowledgement, and the
alerts page's staff-only forms."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from inference.models import Rig
from monitoring.alerts import conditions, delivery, services
from monitoring.alerts.conditions import Facts, Track, step
from monitoring.alerts.models import Alert, AlertChannel, AlertRule, Delivery, Silence
from tests.alertkit import HttpReceiver, SmtpReceiver, wait_for

# Pure pieces -------------------------------------------------------------------------------------------


def test_a_rule_fires_only_after_its_condition_held_for_its_duration_and_resolves_after_clear_for_its_own():
    track = Track()
    assert step(track, bad=True, firing=False, now=0, for_s=10, clear_s=5) is None
    assert step(track, bad=True, firing=False, now=9.9, for_s=10, clear_s=5) is None
    assert step(track, bad=True, firing=False, now=10, for_s=10, clear_s=5) == "fire"
    assert step(track, bad=False, firing=True, now=11, for_s=10, clear_s=5) is None
    assert step(track, bad=False, firing=True, now=15.9, for_s=10, clear_s=5) is None
    assert step(track, bad=False, firing=True, now=16, for_s=10, clear_s=5) == "resolve"


def test_a_condition_that_flaps_faster_than_the_durations_neither_fires_nor_resolves():
    track = Track()
    changes = [step(track, bad=t % 4 < 2, firing=False, now=t, for_s=3, clear_s=3) for t in range(60)]
    assert set(changes) == {None}
    track = Track()
    step(track, bad=True, firing=False, now=0, for_s=0, clear_s=3)
    changes = [step(track, bad=t % 4 < 2, firing=True, now=t, for_s=0, clear_s=3) for t in range(1, 60)]
    assert "resolve" not in changes


@pytest.mark.parametrize(
    "kind, threshold, facts, bad",
    [
        ("spill", None, Facts({}, {"placement": {"spill": True, "label": "1.2 GiB in system RAM"}}), True),
        ("spill", None, Facts({}, {"placement": {"spill": None}}), False),
        ("agent_down", None, Facts({}, {"agent": {"up": False, "error": "no heartbeat"}}, has_agent=True), True),
        ("agent_down", None, Facts({}, {"agent": {"up": True}}, has_agent=True), False),
        ("agent_down", None, Facts({}, {}, has_agent=False), False),
        ("backend_down", None, Facts({}, {"sources": {"backend": {"ok": False, "error": "refused"}}}), True),
        ("backend_down", None, Facts({}, {"sources": {"backend": {"ok": True}}}), False),
        ("model_load_failed", None,
         Facts({}, {"sources": {"backend": {"ok": False, "error": "HTTP 503: Loading model"}}}), True),
        ("model_load_failed", None,
         Facts({}, {"sources": {"backend": {"ok": False, "error": "error: failed to load model 'x.gguf'"}}}), True),
        ("model_load_failed", None, Facts({}, {"sources": {"backend": {"ok": False, "error": "refused"}}}), False),
        ("queue_wait_p95", 30, Facts({}, {}, queue_wait_p95_s=31.0), True),
        ("queue_wait_p95", 30, Facts({}, {}, queue_wait_p95_s=2.0), False),
        ("slots_saturated", None, Facts({"busy_slots": 4.0, "total_slots": 4.0}, {}), True),
        ("slots_saturated", 0.75, Facts({"busy_slots": 2.0, "total_slots": 4.0}, {}), False),
        ("error_rate", 0.5, Facts({}, {}, error_rate=0.6, finished_turns=5), True),
        ("error_rate", 0.5, Facts({}, {}, error_rate=None, finished_turns=0), False),
        ("gpu_temperature", 85, Facts({"gpu0_temperature_c": 60.0, "gpu1_temperature_c": 88.0}, {}), True),
        ("gpu_temperature", 85, Facts({"gpu0_temperature_c": 60.0}, {}), False),
        ("disk", 90, Facts({}, {}, disk_used_pct=95.5), True),
        ("disk", 90, Facts({}, {}, disk_used_pct=40.0), False),
    ],
)  # fmt: skip
def test_each_rule_kind_reads_its_condition_from_the_sample(kind, threshold, facts, bad):
    reading = conditions.CONDITIONS[kind](facts, threshold)
    assert reading.bad is bad, reading
    assert reading.message


def test_every_rule_kind_has_a_condition():
    assert set(conditions.CONDITIONS) == set(AlertRule.Kind.values)


# Delivery ----------------------------------------------------------------------------------------------


@pytest.fixture
def receivers(settings):
    http, smtp = HttpReceiver(), SmtpReceiver()
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", smtp.port
    settings.EMAIL_USE_TLS = settings.EMAIL_USE_SSL = False
    settings.DEFAULT_FROM_EMAIL = "rigdash@example.test"
    yield http, smtp
    http.close()
    smtp.close()


def channels_for(http: HttpReceiver) -> list[AlertChannel]:
    return [
        AlertChannel.objects.create(name="hook", kind="webhook", target=f"{http.url}/hook"),
        AlertChannel.objects.create(name="ntfy", kind="ntfy", target=f"{http.url}/ntfy"),
        AlertChannel.objects.create(name="slack", kind="slack", target=f"{http.url}/slack"),
        AlertChannel.objects.create(name="discord", kind="discord", target=f"{http.url}/discord"),
        AlertChannel.objects.create(name="mail", kind="email", target="ops@example.test, oncall@example.test"),
    ]


def _rig(name: str = "box") -> Rig:
    return Rig.objects.create(name=name, kind="llamacpp", base_url="http://127.0.0.1:9", queue=f"rig.{name}")


def _wait_sent(count: int) -> None:
    wait_for(lambda: Delivery.objects.filter(status__in=["sent", "failed"]).count() >= count, timeout_s=30,
             what=f"{count} deliveries")  # fmt: skip


@pytest.mark.django_db(transaction=True)
def test_an_alert_reaches_every_channel_kind_in_its_own_shape_and_then_its_resolution(receivers):
    http, smtp = receivers
    channels_for(http)
    rig = _rig()
    rule = AlertRule.objects.create(name="GPU hot", kind="gpu_temperature", threshold=85, for_s=0, clear_s=0)
    reading = conditions.Reading(True, 91.0, "hottest GPU 91 °C (at or above 85 °C)")
    alert = services.alert_fire(rule=rule, rig_id=rig.pk, reading=reading, since=timezone.now())
    assert alert is not None
    assert services.alert_fire(rule=rule, rig_id=rig.pk, reading=reading, since=timezone.now()) is None  # one at a time
    _wait_sent(5)
    hook = http.at("/hook")[0].json()
    assert hook["status"] == "firing" and hook["alert"]["rig"] == "box" and hook["alert"]["value"] == 91.0
    assert hook["alert"]["rule"] == "GPU hot" and hook["alert"]["kind"] == "gpu_temperature"
    ntfy = http.at("/ntfy")[0]
    assert ntfy.headers["Title"] == "[RigDash FIRING] GPU hot on box" and ntfy.headers["Priority"] == "high"
    assert ntfy.body.decode() == reading.message
    assert "GPU hot on box" in http.at("/slack")[0].json()["text"]
    assert "GPU hot on box" in http.at("/discord")[0].json()["content"]
    (mail,) = smtp.received
    assert sorted(mail.rcpt) == ["oncall@example.test", "ops@example.test"]
    message = mail.mail()
    assert message["Subject"] == "[RigDash FIRING] GPU hot on box" and message["From"] == "rigdash@example.test"
    assert reading.message in message.get_content()

    assert services.alert_resolve(alert_id=alert.pk, reading=conditions.Reading(False, 70.0, "hottest GPU 70 °C"))
    assert not services.alert_resolve(alert_id=alert.pk)  # once
    _wait_sent(10)
    assert http.at("/hook")[1].json()["status"] == "resolved"
    assert http.at("/ntfy")[1].headers["Priority"] == "default"
    assert smtp.received[1].mail()["Subject"] == "[RigDash RESOLVED] GPU hot on box"
    assert Delivery.objects.filter(status="sent").count() == 10


@pytest.mark.django_db(transaction=True)
def test_a_failing_webhook_is_tried_again_and_its_row_records_the_tries(monkeypatch, settings):
    http = HttpReceiver(fail_first=2)
    monkeypatch.setattr(delivery, "RETRY_S", (0.0, 0.1, 0.1, 0.1))
    try:
        AlertChannel.objects.create(name="hook", kind="webhook", target=f"{http.url}/hook")
        rule = AlertRule.objects.create(name="down", kind="backend_down", for_s=0)
        services.alert_fire(rule=rule, rig_id=_rig().pk, reading=conditions.Reading(True, 0, "down"),
                            since=timezone.now())  # fmt: skip
        _wait_sent(1)
        row = Delivery.objects.get()
        assert (row.status, row.attempts) == ("sent", 3)
        assert len(http.at("/hook")) == 1
    finally:
        http.close()


@pytest.mark.django_db(transaction=True)
def test_an_unreachable_channel_ends_failed_with_its_error_and_does_not_hold_the_others(receivers, monkeypatch):
    http, _ = receivers
    monkeypatch.setattr(delivery, "RETRY_S", (0.0, 0.1))
    AlertChannel.objects.create(name="gone", kind="webhook", target="http://127.0.0.1:9/hook")
    AlertChannel.objects.create(name="hook", kind="webhook", target=f"{http.url}/hook")
    rule = AlertRule.objects.create(name="down", kind="backend_down", for_s=0)
    services.alert_fire(rule=rule, rig_id=_rig().pk, reading=conditions.Reading(True, 0, "down"), since=timezone.now())
    _wait_sent(2)
    gone = Delivery.objects.get(channel__name="gone")
    assert gone.status == "failed" and gone.attempts == 2 and "ConnectError" in gone.error
    assert Delivery.objects.get(channel__name="hook").status == "sent"


@pytest.mark.django_db(transaction=True)
def test_a_silenced_alert_is_recorded_but_not_delivered(receivers, admin_user):
    http, _smtp = receivers
    channels_for(http)
    rig = _rig()
    rule = AlertRule.objects.create(name="down", kind="backend_down", for_s=0)
    services.silence_create(actor=admin_user, rule_id=rule.pk, rig_id=rig.pk, minutes=30, reason="maintenance")
    alert = services.alert_fire(rule=rule, rig_id=rig.pk, reading=conditions.Reading(True, 0, "down"),
                                since=timezone.now())  # fmt: skip
    assert alert is not None and Alert.objects.filter(state="firing").count() == 1
    assert set(Delivery.objects.values_list("status", flat=True)) == {"silenced"}
    Silence.objects.update(until=timezone.now() - timedelta(seconds=1))  # over: the resolution goes out
    services.alert_resolve(alert_id=alert.pk)
    _wait_sent(5)
    assert [r.json()["status"] for r in http.at("/hook")] == ["resolved"]


# The evaluator, on samples -------------------------------------------------------------------------------


def _spill(on: bool) -> dict[str, Any]:
    placement = {"spill": on, "label": "spilled" if on else "all in VRAM"}
    return {"placement": placement, "sources": {"backend": {"ok": True}}}


@pytest.mark.django_db(transaction=True)
def test_the_evaluator_fires_once_while_the_condition_holds_and_resolves_once(receivers):
    http, _ = receivers
    AlertChannel.objects.create(name="hook", kind="webhook", target=f"{http.url}/hook")
    rig = _rig()
    AlertRule.objects.create(name="spill", kind="spill", for_s=3, clear_s=2)
    evaluator = services.Evaluator()
    changes = []
    for t in range(10):
        changes += evaluator.sample_evaluate(rig=rig, series={}, detail=_spill(True), now=1000.0 + t)
    for t in range(10, 20):
        changes += evaluator.sample_evaluate(rig=rig, series={}, detail=_spill(False), now=1000.0 + t)
    assert [c for c, _ in changes] == ["fire", "resolve"]
    _wait_sent(2)
    # Both were queued within milliseconds here, and go out on the pool in parallel: either may arrive first.
    assert sorted(r.json()["status"] for r in http.at("/hook")) == ["firing", "resolved"]
    alert = Alert.objects.get()
    assert alert.state == "resolved" and (alert.fired_at - alert.condition_since).total_seconds() >= 0


@pytest.mark.django_db(transaction=True)
def test_a_rule_for_one_rig_ignores_the_others_and_the_disk_rule_is_one_alert_for_rigdash():
    a, b = _rig("a"), _rig("b")
    AlertRule.objects.create(name="b down", kind="backend_down", rig=b, for_s=0)
    AlertRule.objects.create(name="disk", kind="disk", threshold=0.0, for_s=0)  # any disk is at or above 0 %
    evaluator = services.Evaluator()
    down = {"sources": {"backend": {"ok": False, "error": "refused"}}}
    evaluator.sample_evaluate(rig=a, series={}, detail=down, now=1.0)
    evaluator.sample_evaluate(rig=b, series={}, detail=down, now=1.0)
    firing = {(al.rule.name, al.rig_id) for al in Alert.objects.filter(state="firing")}
    assert firing == {("b down", b.pk), ("disk", None)}


# The page ------------------------------------------------------------------------------------------------


def _client(user: Any) -> Client:
    client = Client(HTTP_HOST="127.0.0.1")
    client.force_login(user)
    return client


@pytest.mark.django_db
def test_the_alerts_page_is_staff_only_and_staff_edit_rules_acknowledge_and_silence(admin_user, other_user):
    assert _client(other_user).get("/alerts/").status_code == 404
    assert Client(HTTP_HOST="127.0.0.1").get("/alerts/").status_code == 302
    staff = _client(admin_user)
    form = {"name": "hot", "kind": "gpu_temperature", "threshold": "85", "for_s": "30", "clear_s": "60",
            "window_s": "300", "enabled": "on"}  # fmt: skip
    response = staff.post("/alerts/rules/new", form)
    assert response.status_code == 302
    rule = AlertRule.objects.get(name="hot")
    assert (rule.threshold, rule.for_s, rule.clear_s) == (85.0, 30, 60)
    refused = staff.post("/alerts/rules/new", {"name": "x", "kind": "disk", "threshold": "٣", "for_s": "1",
                                               "clear_s": "1", "window_s": "300"})  # fmt: skip
    assert refused.status_code == 400
    assert staff.post("/alerts/rules/new", {"name": "x", "kind": "disk", "for_s": "1", "clear_s": "1",
                                            "window_s": "300"}).status_code == 400  # fmt: skip
    assert _client(other_user).post(f"/alerts/rules/{rule.pk}/delete").status_code == 404
    rig = _rig()
    alert = Alert.objects.create(rule=rule, rig=rig, message="hottest GPU 90 °C", condition_since=timezone.now(),
                                 fired_at=timezone.now())  # fmt: skip
    page = staff.get("/alerts/").content.decode()
    assert "hottest GPU 90 °C" in page and "Acknowledge" in page
    assert _client(other_user).post(f"/alerts/{alert.pk}/acknowledge").status_code == 404
    assert staff.post(f"/alerts/{alert.pk}/acknowledge").status_code == 302
    alert.refresh_from_db()
    assert alert.acknowledged_by == admin_user
    assert staff.post("/alerts/silences/new", {"rule": rule.pk, "rig": rig.pk, "minutes": "60"}).status_code == 302
    silence = Silence.objects.get()
    assert silence.covers(alert, timezone.now())
    assert staff.post(f"/alerts/silences/{silence.pk}/end").status_code == 302
    assert not Silence.objects.get().covers(alert, timezone.now())
    channel = staff.post("/alerts/channels/new", {"name": "n", "kind": "webhook", "target": "ftp://x", "enabled": "on"})
    assert channel.status_code == 400
