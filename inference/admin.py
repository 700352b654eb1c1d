from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.auth.admin import UserAdmin
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest

from inference.audit import audit_record
from inference.board import actions, rigs
from inference.errors import InvalidInput
from inference.forms import QuotaForm, RigForm
from inference.models import AuditLog, ChatSession, Quota, Rig, Turn
from rigdash.access import other_active_superusers, outranks


@admin.register(Rig)
class RigAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Rigs: any http(s) host a container network or LAN uses; the queue follows the name (shown, not typed)."""

    form = RigForm
    list_display = ("name", "kind", "base_url", "queue", "slots", "is_default", "enabled")
    readonly_fields = ("queue", "server_slots", "server_models_max")
    fields = (
        "name", "kind", "base_url", "queue", "slots", "server_slots", "server_models_max", "is_default", "enabled",
        "backend_key", "clear_backend_key",
    )  # fmt: skip

    def has_add_permission(self, request: HttpRequest) -> bool:
        return bool(getattr(request.user, "is_superuser", False) and super().has_add_permission(request))

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        fields = tuple(super().get_readonly_fields(request, obj))
        if getattr(request.user, "is_superuser", False):
            return fields
        # The backend key is never shown, not even read-only: staff neither see nor set it.
        shown = tuple(name for name in rigs.SUPERUSER_FIELDS if name not in rigs.SECRET_FIELDS)
        return (*fields, *shown)

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        fields = super().get_fields(request, obj)
        if getattr(request.user, "is_superuser", False):
            return fields
        return [name for name in fields if name not in ("backend_key", "clear_backend_key")]

    def save_model(self, request: HttpRequest, obj: Rig, form: Any, change: bool) -> None:
        obj.queue = Rig.queue_for(obj.name)
        try:
            rigs.rig_save(actor=request.user, rig=obj)
        except InvalidInput as exc:
            raise PermissionDenied(exc.message) from None


@admin.register(ChatSession)
class ChatSessionAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("id", "owner", "rig", "model_name", "title", "updated_at")
    list_select_related = ("owner", "rig")


@admin.register(Turn)
class TurnAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("id", "session", "status", "finish_reason", "output_tokens", "created_at", "finished_at")
    list_filter = ("status",)
    readonly_fields = ("reply_text", "stats")


@admin.register(Quota)
class QuotaAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Quotas edited here are validated like on /board/quotas/ and audited the same way."""

    form = QuotaForm
    list_display = ("__str__", *Quota.LIMIT_FIELDS, "updated_at")

    def save_model(self, request: HttpRequest, obj: Quota, form: Any, change: bool) -> None:
        before = {name: form.initial.get(name) for name in Quota.LIMIT_FIELDS} if change else None
        try:
            actions.quota_save(actor=request.user, quota=obj, before=before)
        except InvalidInput as exc:
            raise PermissionDenied(exc.message) from None

    def delete_model(self, request: HttpRequest, obj: Quota) -> None:
        try:
            actions.quota_delete(actor=request.user, quota=obj)
        except InvalidInput as exc:
            raise PermissionDenied(exc.message) from None

    def delete_queryset(self, request: HttpRequest, queryset: Any) -> None:
        for quota in queryset:  # each through the role check and the audit log
            self.delete_model(request, quota)


@admin.register(AuditLog)
class AuditLogAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("created_at", "actor_name", "action", "target")
    list_filter = ("action",)
    readonly_fields = ("actor", "actor_name", "action", "target", "detail", "created_at")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


ROLE_FIELDS = ("is_active", "is_staff", "is_superuser")


class AuditedUserAdmin(UserAdmin):  # type: ignore[type-arg]
    """Django's user admin, with creation and role or activation changes written to the audit log.

    Roles (``rigdash.access``): only a superuser sets roles or permissions; an account at or above the editor's role
    is read-only to them (their own aside: its role fields stay read-only); the last active superuser stays."""

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        if obj is not None and obj.pk != request.user.pk and not outranks(request.user, obj):
            return False
        return bool(super().has_change_permission(request, obj))

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        if obj is not None and (not outranks(request.user, obj) or _last_superuser(obj)):
            return False
        return bool(super().has_delete_permission(request, obj))

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        fields = tuple(super().get_readonly_fields(request, obj))
        if not getattr(request.user, "is_superuser", False):
            fields += ("is_staff", "is_superuser", "user_permissions")
            if obj is not None and obj.pk == request.user.pk:
                fields += ("is_active", "groups")
        elif obj is not None and _last_superuser(obj):
            fields += ("is_active", "is_superuser")
        return fields

    def save_model(self, request: HttpRequest, obj: User, form: Any, change: bool) -> None:
        before = User.objects.filter(pk=obj.pk).values(*ROLE_FIELDS).first() if change else None
        stops = before and before["is_superuser"] and before["is_active"] and not (obj.is_superuser and obj.is_active)
        if stops and not other_active_superusers(obj.pk):
            raise PermissionDenied("The last active superuser stays.")
        super().save_model(request, obj, form, change)
        if not change:
            audit_record(actor=request.user, action="user.create", target=f"user:{obj.username}", detail={})
            return
        changed = {name: getattr(obj, name) for name in ROLE_FIELDS if before and before[name] != getattr(obj, name)}
        if changed:
            audit_record(actor=request.user, action="user.change", target=f"user:{obj.username}", detail=changed)


def _last_superuser(user: User) -> bool:
    return bool(user.is_superuser and user.is_active and not other_active_superusers(user.pk))


admin.site.unregister(User)
admin.site.register(User, AuditedUserAdmin)
