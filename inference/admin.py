from __future__ import annotations

from django.contrib import admin

from inference.models import ChatSession, Rig, Turn


@admin.register(Rig)
class RigAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("name", "kind", "base_url", "queue", "is_default", "enabled")


@admin.register(ChatSession)
class ChatSessionAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("id", "owner", "rig", "model_name", "title", "updated_at")
    list_select_related = ("owner", "rig")


@admin.register(Turn)
class TurnAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("id", "session", "status", "finish_reason", "created_at", "finished_at")
    list_filter = ("status",)
    readonly_fields = ("reply_text", "stats")
