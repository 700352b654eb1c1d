"""Rigs (configured backends), chat sessions and turns (one user message and the model's reply)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.conf import settings
from django.contrib.auth.models import Group
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from inference.validators import validate_backend_key, validate_backend_url


class Rig(models.Model):
    """A backend server RigDash drives; each rig has its own Celery queue, ``rig.<name>`` (queue_for)."""

    class Kind(models.TextChoices):
        LLAMACPP = "llamacpp", "llama.cpp server"
        OLLAMA = "ollama", "Ollama"
        OPENAI = "openai", "OpenAI-compatible server"

    name = models.SlugField(max_length=64, unique=True)
    kind = models.CharField(max_length=16, choices=Kind.choices)
    base_url = models.CharField(
        max_length=300,
        validators=[validate_backend_url],
        help_text="Set by admins only; RigDash connects here: http(s)://host[:port], e.g. http://ollama:11434.",
    )
    # Derived from the name when the rig is saved without one (Rig.save); the admin shows it read-only.
    queue = models.CharField(
        max_length=100, unique=True, blank=True, help_text="The Celery queue a worker for this rig consumes."
    )
    is_default = models.BooleanField(default=False)
    enabled = models.BooleanField(default=True)
    slots = models.PositiveSmallIntegerField(
        default=4,
        validators=[MinValueValidator(1), MaxValueValidator(256)],
        help_text="Turns the backend decodes at once (llama-server -np); more wait in RigDash's fair queue. "
        "Where the server reports fewer slots, RigDash hands it no more than it has.",
    )
    # The slots the server itself reports (llama-server's /props total_slots; the sampler records it, Rig.capacity);
    # None where it reports none (Ollama, a router whose instances each have their own, a server not read yet).
    server_slots = models.PositiveSmallIntegerField(null=True, blank=True, editable=False)
    # The most models a llama-server router holds at once (its /props max_instances, --models-max; the sampler
    # records it): the fair queue holds other models' turns while one waits for a swap (inference/queue/swaps.py).
    # None where there is no such limit (one model, a router without one, Ollama, a server not read yet).
    server_models_max = models.PositiveSmallIntegerField(null=True, blank=True, editable=False)
    agent_key = models.CharField(
        max_length=128,
        blank=True,
        help_text="The rig agent's secret (RIGDASH_AGENT_KEY on the rig's host); empty when no agent runs beside it.",
    )
    # Sent as a bearer token on every request to the backend (llama-server --api-key, vLLM --api-key, a proxy in
    # front of Ollama); never shown back on a page.
    api_key = models.CharField(
        max_length=256,
        blank=True,
        validators=[validate_backend_key],
        help_text="The backend's own key (llama-server --api-key), sent as a bearer token; empty when it takes none.",
    )
    # The model names the backend last listed (Rig.record_models): placement sends a chat that targets a model to
    # any enabled rig serving it (inference/queue/placement.py).
    models_served = models.JSONField(default=list, blank=True, editable=False)
    # What the environment last set (inference.bootstrap): a field an admin has changed since keeps the admin's value.
    bootstrapped = models.JSONField(default=dict, blank=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.name} ({self.kind})"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if not self.queue:
            self.queue = self.queue_for(self.name)
            update_fields = kwargs.get("update_fields")
            if update_fields is not None:
                kwargs["update_fields"] = {*update_fields, "queue"}
        super().save(*args, **kwargs)

    def record_models(self, names: Any) -> None:
        """Remember the models the backend says it serves now; one UPDATE, only when they changed."""
        self._remember(models_served=sorted({str(name) for name in names}))

    @property
    def capacity(self) -> int:
        """The turns RigDash hands the backend at once: its slots, and never more than the server says it has (a
        server with fewer would queue the rest itself, out of the fair queue's reach)."""
        return min(self.slots, self.server_slots) if self.server_slots else self.slots

    def record_server_slots(self, slots: int | None) -> None:
        """Remember the slots the server reports now; one UPDATE, only when they changed. Slots that opened take
        waiting turns at the next dispatch (a turn's end, a submit, or Celery beat's every few seconds)."""
        self._remember(server_slots=slots)

    def record_server_models_max(self, models_max: int | None) -> None:
        """Remember the most models the router holds at once; one UPDATE, only when it changed."""
        self._remember(server_models_max=models_max)

    def _remember(self, **values: Any) -> None:
        """Keep what the backend says of itself: the fields whose value changed, in one UPDATE (none when none did),
        with no save signal (nothing else about the rig changed)."""
        changed = {name: value for name, value in values.items() if getattr(self, name) != value}
        if changed:
            for name, value in changed.items():
                setattr(self, name, value)
            Rig.objects.filter(pk=self.pk).update(**changed)

    def serves(self, model_name: str) -> bool:
        return model_name in (self.models_served or ())

    @staticmethod
    def queue_for(name: str) -> str:
        """The Celery queue of the rig named ``name``: a worker serves it with ``-Q rig.<name>``."""
        return f"rig.{name}"


class ChatSession(models.Model):
    class Placement(models.TextChoices):
        RIG = "rig", "this rig"
        MODEL = "model", "any rig serving the model"

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="chat_sessions")
    # The rig of the chat's turn now running, or of its last one. A chat placed by model (``placement``) moves to the
    # rig each turn is handed to (inference/queue/placement.py); each turn keeps the rig that ran it (``Turn.rig``).
    rig = models.ForeignKey(Rig, on_delete=models.PROTECT, related_name="sessions")
    placement = models.CharField(max_length=8, choices=Placement.choices, default=Placement.RIG)
    model_name = models.CharField(max_length=200)
    title = models.CharField(max_length=200, blank=True)
    # A session made by one request of the OpenAI-compatible API: the key it came with, and the messages the request
    # gave before its last user message (system and earlier turns), said before the session's own turns.
    api_key = models.ForeignKey("ApiKey", null=True, blank=True, on_delete=models.SET_NULL, related_name="sessions")
    context_messages = models.JSONField(default=list, blank=True)
    # A session of a key that stores nothing (``ApiKey.Storage.NOTHING``): not in its owner's chat list, and its
    # texts (the request's messages, the reply) are wiped once the reply has been delivered (inference/turns/api.py).
    hidden = models.BooleanField(default=False)
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
    # The rig that runs or ran the turn: its chat's rig, or for a chat placed by model the rig it was handed to
    # (empty while it waits for one).
    rig = models.ForeignKey(Rig, null=True, blank=True, on_delete=models.PROTECT, related_name="turns")
    user_text = models.TextField()
    params = models.JSONField(default=dict, blank=True)
    reply_text = models.TextField(blank=True)
    thinking_text = models.TextField(blank=True, default="")  # a reasoning model's thoughts before its reply
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
        # created_at: usage's recent days and its rollup (inference/turns/usage_rollup.py), read from the index alone
        # (PostgreSQL; elsewhere the included columns are left out); finished_at: the board's ended turns and a
        # rig's latest replies, newest first (docs/benchmarks.md, "Cost as the data grows").
        indexes = [
            models.Index(fields=["status"]),
            models.Index(fields=["started_at"]),
            models.Index(
                fields=["created_at"],
                name="turn_created_at",
                include=["id", "session", "started_at", "finished_at", "prompt_tokens", "output_tokens"],
            ),
            models.Index(fields=["finished_at"], name="turn_finished_at"),
        ]

    def __str__(self) -> str:
        return f"Turn {self.pk} ({self.status})"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if self.rig_id is None and self._state.adding and self.session.placement == ChatSession.Placement.RIG:
            self.rig_id = self.session.rig_id  # a chat on one rig runs every turn there
        super().save(*args, **kwargs)

    @property
    def is_active(self) -> bool:
        return self.status in self.ACTIVE

    def prompt_message(self) -> dict[str, Any]:
        """The message this turn adds to its conversation: its user's text, or an API request's last message as the
        client sent it (a tool's result, an assistant's start to continue, content parts: ``params["message"]``)."""
        message = (self.params or {}).get("message")
        return dict(message) if isinstance(message, dict) else {"role": "user", "content": self.user_text}

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
    # Rate limits over a sliding minute, in Redis (inference/queue/ratelimits.py): per user (all their chats and keys)
    # and per API key (each of the user's keys on its own).
    requests_per_minute = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1), MaxValueValidator(100_000)],
        help_text="Turns (chat messages and API requests) per minute, all together (1-100,000).",
    )  # fmt: skip
    tokens_per_minute = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1), MaxValueValidator(100_000_000)],
        help_text="Reply tokens per minute, all together (1-100,000,000).",
    )  # fmt: skip
    key_requests_per_minute = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1), MaxValueValidator(100_000)],
        help_text="API requests per minute through each API key (1-100,000).",
    )  # fmt: skip
    key_tokens_per_minute = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1), MaxValueValidator(100_000_000)],
        help_text="Reply tokens per minute through each API key (1-100,000,000).",
    )  # fmt: skip
    updated_at = models.DateTimeField(auto_now=True)

    LIMIT_FIELDS = ("max_concurrent_turns", "max_output_tokens_per_day", "max_tokens_per_reply", "max_context_tokens")
    RATE_FIELDS = ("requests_per_minute", "tokens_per_minute", "key_requests_per_minute", "key_tokens_per_minute")

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


class ApiKey(models.Model):
    """A user's key for the OpenAI-compatible API (/v1/). The key is shown once; only its SHA-256 is stored
    (a random 256-bit secret needs no slow password hash: there is nothing to guess from its digest)."""

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16, help_text="The key's first characters, to tell keys apart.")
    key_sha256 = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoked_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # When the periodic pass found the key expired and cancelled its waiting and running requests (once).
    expiry_applied_at = models.DateTimeField(null=True, blank=True)

    class Storage(models.TextChoices):
        CHATS = "chats", "store as chats in the chat list"
        NOTHING = "nothing", "store nothing (only counts and timings)"

    storage = models.CharField(max_length=8, choices=Storage.choices, default=Storage.CHATS)
    # Not a column: True on a copy a request got from its process's memory of active keys, until its row confirms it
    # (inference/board/apikeys.py). Such a key may send an early request and nothing else.
    unconfirmed = False

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["owner", "-created_at"]),
            # The expiry pass's keys: expiring, not yet applied.
            models.Index(
                fields=["expires_at"],
                name="apikey_expiry_due",
                condition=models.Q(expires_at__isnull=False, expiry_applied_at__isnull=True),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    def state(self, now: datetime) -> str:
        """active | expired | revoked"""
        if self.revoked_at is not None:
            return "revoked"
        if self.expires_at is not None and self.expires_at <= now:
            return "expired"
        return "active"


class UsageDay(models.Model):
    """Usage of one user, model and API key (or none: the chat pages) on one closed UTC day: what
    ``inference.turns.usage`` adds up from turns, stored once the day is over, so a year of usage reads a few rows a
    day instead of every turn (inference/turns/usage_rollup.py)."""

    day = models.DateField()
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    model_name = models.CharField(max_length=200)
    # Keys are deleted only with their owner, whose rows go with the user (CASCADE either way).
    api_key = models.ForeignKey("ApiKey", null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    turns = models.PositiveIntegerField(default=0)
    prompt_tokens = models.PositiveBigIntegerField(default=0)
    output_tokens = models.PositiveBigIntegerField(default=0)
    busy_s = models.FloatField(default=0.0)

    class Meta:
        # Two partial unique indexes, as NULLs are distinct in a unique index on both PostgreSQL and SQLite (and
        # NULLS NOT DISTINCT is PostgreSQL 15's only): https://www.postgresql.org/docs/current/indexes-unique.html
        constraints = [
            models.UniqueConstraint(
                fields=["day", "user", "model_name"], condition=models.Q(api_key__isnull=True),
                name="usage_day_user_model_nokey",
            ),
            models.UniqueConstraint(
                fields=["day", "user", "model_name", "api_key"], condition=models.Q(api_key__isnull=False),
                name="usage_day_user_model_key",
            ),
        ]  # fmt: skip
        indexes = [models.Index(fields=["user", "day"], name="usage_day_user")]

    def __str__(self) -> str:
        return f"usage of user {self.user_id} on {self.day} ({self.model_name})"


class UsageRolledDay(models.Model):
    """A UTC day whose turns are in UsageDay (a day without turns has no UsageDay rows, but is rolled up)."""

    day = models.DateField(primary_key=True)

    def __str__(self) -> str:
        return f"usage of {self.day} rolled up"


class UsageCsvMonth(models.Model):
    """The usage CSV's lines for one closed calendar month of every user, as PostgreSQL writes them
    (inference/turns/usage_csv.py): read back only while that month's users still have the names they had."""

    month = models.DateField(primary_key=True)  # its first day
    user_ids = models.TextField()  # the month's users, comma-separated ids in ascending order
    names_md5 = models.CharField(max_length=32)  # md5 of "id:username" of those users, comma-joined
    body = models.TextField()

    def __str__(self) -> str:
        return f"usage CSV of {self.month:%Y-%m}"


class UsageRangeSums(models.Model):
    """The usage page's sums over the rolled-up days of one range (inference/turns/usage_sums.py), as JSON: of
    everyone (``scope`` "*", read back only while the users are the ones summed, ``user_ids_md5``) or of one user
    (``scope`` the user's id). A range ends on the last closed day, so the next day's ranges are new rows; the rollup
    deletes the ranges it writes into and those ending before the newest day it closes."""

    first_day = models.DateField()
    last_day = models.DateField()
    scope = models.CharField(max_length=24)
    user_ids_md5 = models.CharField(max_length=32, blank=True)
    body = models.TextField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["first_day", "last_day", "scope"], name="usage_range_sums_range_scope")
        ]

    def __str__(self) -> str:
        return f"usage sums of {self.scope} from {self.first_day} to {self.last_day}"


class LastServed(models.Model):
    """When the fair queue last handed one of a user's turns to a rig (inference/queue/dispatch.py): one row per
    user and rig, so ordering waiting turns reads these rows, not the rig's whole history of turns."""

    rig = models.ForeignKey(Rig, on_delete=models.CASCADE, related_name="+")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    at = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["rig", "user"], name="last_served_rig_user")]

    def __str__(self) -> str:
        return f"user {self.user_id} last served on rig {self.rig_id} at {self.at}"


class Sweep(models.Model):
    """A staff member's decode sweep of one rig: a ladder of prompt lengths times a ladder of parallel sessions, each
    step run as ordinary turns of its owner through the fair queue (inference/board/sweeps.py, docs/calculator.md)."""

    class Status(models.TextChoices):
        RUNNING = "running"
        DONE = "done"
        FAILED = "failed"
        CANCELLED = "cancelled"

    rig = models.ForeignKey(Rig, on_delete=models.CASCADE, related_name="sweeps")
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="sweeps")
    model_name = models.CharField(max_length=200)
    contexts = models.JSONField(default=list)  # prompt tokens per step, ascending
    sessions = models.JSONField(default=list)  # sessions decoding together per step, ascending
    max_tokens = models.PositiveIntegerField()
    forced = models.BooleanField(default=False)  # started while the rig had other turns
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.RUNNING)
    step = models.PositiveIntegerField(default=0)  # steps finished; the step running is this one
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    looked_at = models.DateTimeField(null=True, blank=True)  # the driver's last look (a lost look is re-sent)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            # One sweep at a time per rig, whatever races two starts.
            models.UniqueConstraint(fields=["rig"], condition=models.Q(status="running"), name="sweep_one_running")
        ]

    def __str__(self) -> str:
        return f"sweep {self.pk} of {self.rig_id} ({self.status})"

    @property
    def steps(self) -> list[tuple[int, int]]:
        """(prompt tokens, sessions) of every step, in the order they run: each context, every session count."""
        return [(context, sessions) for context in self.contexts for sessions in self.sessions]


class SweepPoint(models.Model):
    """One turn of a sweep's step, and what it measured once it ended (from the turn's stats); or a warm-up turn."""

    sweep = models.ForeignKey(Sweep, on_delete=models.CASCADE, related_name="points")
    step = models.PositiveIntegerField()
    context_target = models.PositiveIntegerField()  # the prompt tokens the step asked for
    sessions = models.PositiveIntegerField()  # the turns the step submitted together
    turn = models.OneToOneField(Turn, null=True, on_delete=models.SET_NULL, related_name="sweep_point")
    # A warm-up turn reads the step's prompt into the backend's cache (one token of reply) and is not measured.
    warmup = models.BooleanField(default=False)
    status = models.CharField(max_length=16, blank=True)  # the turn's end status, once it ended
    prompt_tokens = models.PositiveIntegerField(null=True)
    output_tokens = models.PositiveIntegerField(null=True)
    decode_tps = models.FloatField(null=True)
    context_mean = models.FloatField(null=True)  # prompt plus half the reply: the mean context while decoding
    decoding_together = models.PositiveIntegerField(null=True)  # the rig's turns decoding at this turn's midpoint

    class Meta:
        ordering = ["step", "id"]

    def __str__(self) -> str:
        return f"point {self.pk} of sweep {self.sweep_id}, step {self.step}"
