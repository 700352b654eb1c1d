"""Rigs (configured backends), chat sessions and turns (one user message and the model's reply)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
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
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-updated_at"]
        indexes = [models.Index(fields=["owner", "-updated_at"])]

    def __str__(self) -> str:
        return self.title or f"Session {self.pk}"


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
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created_at", "id"]
        indexes = [models.Index(fields=["status"])]

    def __str__(self) -> str:
        return f"Turn {self.pk} ({self.status})"

    @property
    def is_active(self) -> bool:
        return self.status in self.ACTIVE

    def as_history_messages(self) -> list[dict[str, Any]]:
        """This turn as chat messages for the next prompt (a reply cut short still counts as said)."""
        messages: list[dict[str, Any]] = [{"role": "user", "content": self.user_text}]
        if self.reply_text:
            messages.append({"role": "assistant", "content": self.reply_text})
        return messages
