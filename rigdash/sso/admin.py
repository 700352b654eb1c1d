"""Django admin: which provider subject signs in as which account (delete a row to let that subject start afresh)."""

from __future__ import annotations

from django.contrib import admin

from rigdash.sso.models import ExternalIdentity


@admin.register(ExternalIdentity)
class ExternalIdentityAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("user", "subject", "issuer", "created_at", "last_login_at")
    search_fields = ("user__username", "subject")
    readonly_fields = ("user", "issuer", "subject", "created_at", "last_login_at")

    def has_add_permission(self, request: object, obj: object = None) -> bool:
        return False
