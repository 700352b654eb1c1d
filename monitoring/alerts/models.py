"""Alert rules (a condition on a rig's samples, a threshold, how long it must hold to fire and be clear to resolve),
where alerts go (channels), the alerts themselves, silences, and each delivery's record."""

from __future__ import annotations

from datetime import datetime

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from inference.models import Rig


class AlertRule(models.Model):
    """One condition watched on every sample of one rig (or of every rig: ``rig`` empty)."""

    class Kind(models.TextChoices):
        SPILL = "spill", "weights spilled to system RAM"
        AGENT_DOWN = "agent_down", "rig agent down"
        BACKEND_DOWN = "backend_down", "backend down"
        MODEL_LOAD_FAILED = "model_load_failed", "model failed to load"
        QUEUE_WAIT_P95 = "queue_wait_p95", "queue wait p95 above threshold (s)"
        SLOTS_SATURATED = "slots_saturated", "busy slots / slots at or above threshold (0-1)"
        ERROR_RATE = "error_rate", "failed / finished turns at or above threshold (0-1)"
        GPU_TEMPERATURE = "gpu_temperature", "hottest GPU at or above threshold (°C)"
        DISK = "disk", "RigDash's disk used at or above threshold (%)"

    name = models.CharField(max_length=100)
    kind = models.CharField(max_length=32, choices=Kind.choices)
    rig = models.ForeignKey(Rig, null=True, blank=True, on_delete=models.CASCADE, related_name="+",
                            help_text="Empty: every enabled rig.")  # fmt: skip
    threshold = models.FloatField(null=True, blank=True, help_text="For the kinds that compare a figure.")
    for_s = models.PositiveIntegerField(
        default=60, validators=[MinValueValidator(0), MaxValueValidator(86_400)],
        help_text="Seconds the condition must hold before the alert fires.",
    )  # fmt: skip
    clear_s = models.PositiveIntegerField(
        default=60, validators=[MinValueValidator(0), MaxValueValidator(86_400)],
        help_text="Seconds the condition must be clear before the alert resolves.",
    )  # fmt: skip
    window_s = models.PositiveIntegerField(
        default=300, validators=[MinValueValidator(10), MaxValueValidator(86_400)],
        help_text="The turns looked at for queue wait p95 and error rate: those of the last N seconds.",
    )  # fmt: skip
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name", "id"]

    def __str__(self) -> str:
        return self.name


class AlertChannel(models.Model):
    """Where alerts are delivered: a webhook of one flavour, or email addresses."""

    class Kind(models.TextChoices):
        WEBHOOK = "webhook", "generic JSON webhook"
        NTFY = "ntfy", "ntfy topic URL"
        SLACK = "slack", "Slack incoming webhook"
        DISCORD = "discord", "Discord webhook"
        EMAIL = "email", "email (Django's mail settings)"

    name = models.CharField(max_length=100)
    kind = models.CharField(max_length=16, choices=Kind.choices)
    target = models.CharField(max_length=1000, help_text="The URL, or email addresses separated by commas.")
    enabled = models.BooleanField(default=True)

    class Meta:
        ordering = ["name", "id"]

    def __str__(self) -> str:
        return f"{self.name} ({self.kind})"


class Alert(models.Model):
    """One firing of a rule on a rig, until it resolves. At most one firing alert per rule and rig."""

    class State(models.TextChoices):
        FIRING = "firing"
        RESOLVED = "resolved"

    rule = models.ForeignKey(AlertRule, on_delete=models.CASCADE, related_name="alerts")
    rig = models.ForeignKey(Rig, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    state = models.CharField(max_length=16, choices=State.choices, default=State.FIRING)
    value = models.FloatField(null=True, blank=True)
    message = models.TextField(blank=True)
    condition_since = models.DateTimeField()
    fired_at = models.DateTimeField()
    resolved_at = models.DateTimeField(null=True, blank=True)
    acknowledged_at = models.DateTimeField(null=True, blank=True)
    acknowledged_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["-fired_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["rule", "rig"], condition=models.Q(state="firing"), nulls_distinct=False,
                name="alert_one_firing_per_rule_rig",
            ),
        ]  # fmt: skip

    def __str__(self) -> str:
        return f"{self.rule.name} on {self.rig.name if self.rig else 'RigDash'}: {self.state}"


class Silence(models.Model):
    """No delivery, until ``until``, for alerts of a rule and/or a rig (both empty: everything)."""

    rule = models.ForeignKey(AlertRule, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    rig = models.ForeignKey(Rig, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    until = models.DateTimeField()
    reason = models.CharField(max_length=200, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-until", "-id"]

    def __str__(self) -> str:
        return f"silence of {self.rule or 'every rule'} on {self.rig or 'every rig'} until {self.until:%Y-%m-%d %H:%M}"

    def covers(self, alert: Alert, now: datetime) -> bool:
        return (
            self.until > now
            and (self.rule_id is None or self.rule_id == alert.rule_id)
            and (self.rig_id is None or self.rig_id == alert.rig_id)
        )


class Delivery(models.Model):
    """One message (an alert firing or resolving) to one channel, with its attempts."""

    class Status(models.TextChoices):
        PENDING = "pending"
        SENT = "sent"
        FAILED = "failed"
        SILENCED = "silenced"

    alert = models.ForeignKey(Alert, on_delete=models.CASCADE, related_name="deliveries")
    channel = models.ForeignKey(AlertChannel, on_delete=models.CASCADE, related_name="deliveries")
    event = models.CharField(max_length=16, choices=Alert.State.choices)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["status", "created_at"])]

    def __str__(self) -> str:
        return f"{self.event} of alert {self.alert_id} to {self.channel_id}: {self.status}"
