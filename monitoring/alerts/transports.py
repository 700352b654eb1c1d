"""How an alert reaches a channel: one sender per channel kind, registered in ``TRANSPORTS``.

- webhook: a generic JSON body (``payload``), POSTed;
- ntfy: the message as the body, with ``Title``, ``Priority`` and ``Tags`` headers (https://docs.ntfy.sh/publish/);
- slack: ``{"text": ...}`` (https://api.slack.com/messaging/webhooks); Discord takes it too at ``<webhook>/slack``;
- discord: ``{"content": ...}`` (https://discord.com/developers/docs/resources/webhook#execute-webhook);
- email: Django's ``send_mail`` through its mail settings (``EMAIL_HOST``...; README).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
from django.conf import settings
from django.core.mail import send_mail

from monitoring.alerts.models import Alert, AlertChannel

HTTP_TIMEOUT_S = 5.0


def payload(alert: Alert, event: str) -> dict[str, Any]:
    """The generic webhook's JSON: the event ("firing" or "resolved") and the alert."""
    rule = alert.rule
    return {
        "version": 1,
        "source": "rigdash",
        "status": event,
        "alert": {
            "id": alert.pk,
            "rule": rule.name,
            "kind": rule.kind,
            "rig": alert.rig.name if alert.rig else None,
            "value": alert.value,
            "threshold": rule.threshold,
            "for_s": rule.for_s,
            "message": alert.message,
            "condition_since": alert.condition_since.isoformat(),
            "fired_at": alert.fired_at.isoformat(),
            "resolved_at": alert.resolved_at.isoformat() if alert.resolved_at else None,
        },
    }


def subject(alert: Alert, event: str) -> str:
    where = alert.rig.name if alert.rig else "RigDash"
    return f"[RigDash {event.upper()}] {alert.rule.name} on {where}"


def text(alert: Alert, event: str) -> str:
    when = alert.resolved_at if event == Alert.State.RESOLVED and alert.resolved_at else alert.fired_at
    return f"{subject(alert, event)}\n{alert.message}\n({event} at {when:%Y-%m-%d %H:%M:%S} UTC, alert #{alert.pk})"


def _post(url: str, **kwargs: Any) -> None:
    response = httpx.post(url, timeout=HTTP_TIMEOUT_S, **kwargs)
    response.raise_for_status()


def send_webhook(channel: AlertChannel, alert: Alert, event: str) -> None:
    _post(channel.target, json=payload(alert, event))


def send_ntfy(channel: AlertChannel, alert: Alert, event: str) -> None:
    firing = event == Alert.State.FIRING
    headers = {
        "Title": subject(alert, event),
        "Priority": "high" if firing else "default",
        "Tags": "rotating_light" if firing else "white_check_mark",
    }
    _post(channel.target, content=alert.message.encode(), headers=headers)


def send_slack(channel: AlertChannel, alert: Alert, event: str) -> None:
    _post(channel.target, json={"text": text(alert, event)})


def send_discord(channel: AlertChannel, alert: Alert, event: str) -> None:
    _post(channel.target, json={"content": text(alert, event)[:2000]})


def send_email(channel: AlertChannel, alert: Alert, event: str) -> None:
    recipients = [address.strip() for address in channel.target.split(",") if address.strip()]
    send_mail(subject(alert, event), text(alert, event), settings.DEFAULT_FROM_EMAIL, recipients, fail_silently=False)


TRANSPORTS: dict[str, Callable[[AlertChannel, Alert, str], None]] = {
    AlertChannel.Kind.WEBHOOK: send_webhook,
    AlertChannel.Kind.NTFY: send_ntfy,
    AlertChannel.Kind.SLACK: send_slack,
    AlertChannel.Kind.DISCORD: send_discord,
    AlertChannel.Kind.EMAIL: send_email,
}
