"""Rigs (configured backends), chat sessions and turns (one user message and the model's reply)."""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.models import Group
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models


class Rig(models.Model):
    """A backend server RigDash drives; each rig has its own Celery queue."""

    class Kind(models.TextChoices):
        LLAMACPP = "llamacpp", "llama.cpp server"
        OLLAMA = "ollama", "Ollama"

    name = models.SlugField(max_length=64, unique=True)
    kind = models.CharField(max_length=16, choices=Kind.choices)
    base_url = models.URLField(max_length=300, help_text="Set by admins only; RigDash connects here.")
    queue = models.CharField(max_length=100, unique=True)
    is_default = models.BooleanField(default=False)
    enabled = models.BooleanField(default=True)
    slots = models.PositiveSmallIntegerField(
        default=4,
        validators=[MinValueValidator(1), MaxValueValidator(256)],
        help_text="Turns the backend decodes at once (llama-server -np); more wait in RigDash's fair queue.",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.name} ({self.kind})"


class ChatSession(models.Model):
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="chat_sessions")
    rig = models.ForeignKey(Rig, on_delete=models.PROTECT, related_name="sessions")
    model_name = models.CharField(max_length=200)
    title = models.CharField(max_length=200, blank=True)
    # Generation settings (system prompt, sampling, stop strings), checked by inference/turns/params.py and
    # copied onto each new turn's params.
    settings = models.JSONField(default=dict, blank=True)
    # A branch (inference/turns/branch.py): a copy of another chat up to one of its turns, which it answers again
    # (regenerate) or with an edited message. The original keeps its version of that turn.
    branch_of = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="branches")
    branch_of_turn = models.ForeignKey("Turn", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    branch_at = models.PositiveIntegerField(null=True, blank=True)  # turns copied: the next one is the new version
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-updated_at"]
        indexes = [models.Index(fields=["owner", "-updated_at"])]

    def __str__(self) -> str:
        return self.title or f"Session {self.pk}"


class ChatPreset(models.Model):
    """A user's named set of chat settings, applied to a chat by copying them."""

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="chat_presets")
    name = models.CharField(max_length=60)
    settings = models.JSONField(default=dict, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["owner", "name"], name="chat_preset_owner_name")]

    def __str__(self) -> str:
        return self.name


class Turn(models.Model):
    """queued -> prompt -> decoding -> done | failed | cancelled | interrupted."""

    class Status(models.TextChoices):
        QUEUED = "queued"
        PROMPT = "prompt"
        DECODING = "decoding"
        DONE = "done"
        FAILED = "failed"
        CANCELLED = "cancelled"
        INTERRUPTED = "interrupted"

    ACTIVE = (Status.QUEUED, Status.PROMPT, Status.DECODING)
    RUNNING = (Status.PROMPT, Status.DECODING)

    session = models.ForeignKey(ChatSession, on_delete=models.CASCADE, related_name="turns")
    user_text = models.TextField()
    params = models.JSONField(default=dict, blank=True)
    reply_text = models.TextField(blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    finish_reason = models.CharField(max_length=32, blank=True)
    error = models.TextField(blank=True)
    cancel_requested = models.BooleanField(default=False)
    stats = models.JSONField(default=dict, blank=True)
    worker = models.CharField(max_length=200, blank=True)
    # Fair queue and quotas (inference/queue/dispatch.py, inference/queue/quotas.py): when the turn was handed to
    # Celery, the reply-token cap it was granted (counted against the daily allowance while it runs)
    # and the token counts stored at its end (for usage and daily quotas).
    dispatched_at = models.DateTimeField(null=True, blank=True)
    token_cap = models.PositiveIntegerField(null=True, blank=True)
    prompt_tokens = models.PositiveIntegerField(null=True, blank=True)
    output_tokens = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created_at", "id"]
        indexes = [models.Index(fields=["status"]), models.Index(fields=["started_at"])]

    def __str__(self) -> str:
        return f"Turn {self.pk} ({self.status})"

    @property
    def is_active(self) -> bool:
        return self.status in self.ACTIVE

    def as_history_messages(self) -> list[dict[str, str]]:
        """This turn as chat messages for the next prompt (a reply cut short still counts as said)."""
        return self.history_messages(self.user_text, self.reply_text)

    @staticmethod
    def history_messages(user_text: str, reply_text: str) -> list[dict[str, str]]:
        messages = [{"role": "user", "content": user_text}]
        if reply_text:
            messages.append({"role": "assistant", "content": reply_text})
        return messages


class Quota(models.Model):
    """Limits for one user, one group, or everyone (neither set). Empty fields set no limit.

    A user's own quota wins field by field; else the most generous of their groups' quotas; else the
    default quota (see inference/queue/quotas.py).
    """

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE, related_name="quota"
    )
    group = models.OneToOneField(Group, null=True, blank=True, on_delete=models.CASCADE, related_name="quota")
    max_concurrent_turns = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1), MaxValueValidator(64)],
        help_text="Replies running or waiting at once (1-64).",
    )  # fmt: skip
    max_output_tokens_per_day = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1), MaxValueValidator(100_000_000)],
        help_text="Reply tokens per UTC day (1-100,000,000); resets at 00:00 UTC.",
    )  # fmt: skip
    max_tokens_per_reply = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1), MaxValueValidator(32_768)],
        help_text="Longest reply in tokens (1-32,768).",
    )  # fmt: skip
    max_context_tokens = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(16), MaxValueValidator(1_048_576)],
        help_text="Largest prompt (the conversation so far) in tokens (16-1,048,576).",
    )  # fmt: skip
    updated_at = models.DateTimeField(auto_now=True)

    LIMIT_FIELDS = ("max_concurrent_turns", "max_output_tokens_per_day", "max_tokens_per_reply", "max_context_tokens")

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=~(models.Q(user__isnull=False) & models.Q(group__isnull=False)),
                name="quota_user_or_group",
            ),
        ]

    def __str__(self) -> str:
        if self.user_id:
            return f"quota for user {self.user}"
        if self.group_id:
            return f"quota for group {self.group}"
        return "default quota"

    def clean(self) -> None:
        from django.core.exceptions import ValidationError

        super().clean()
        if self.user_id and self.group_id:
            raise ValidationError("A quota is for one user or one group (or, with neither, for everyone), not both.")
        if not self.user_id and not self.group_id:
            others = Quota.objects.filter(user__isnull=True, group__isnull=True).exclude(pk=self.pk)
            if others.exists():
                raise ValidationError("There is already a default quota (for everyone); edit that one.")

    @property
    def scope(self) -> str:
        return "user" if self.user_id else "group" if self.group_id else "default"


class AuditLog(models.Model):
    """One admin action (cancel, quota change, user change, model pull...). Written by audit.audit_record."""

    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    actor_name = models.CharField(max_length=150)
    action = models.CharField(max_length=64)
    target = models.CharField(max_length=200)
    detail = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.created_at:%Y-%m-%d %H:%M:%S} {self.actor_name} {self.action} {self.target}"
