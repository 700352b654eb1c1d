"""Admin pages under /board/ (staff only) and usage pages under /usage/ (everyone sees their own)."""

from __future__ import annotations

from django.urls import path

from inference import views_admin as views

app_name = "board"

urlpatterns = [
    path("board/", views.board_page, name="board"),
    path("board/api/turns", views.api_board_turns, name="api_turns"),
    path("board/api/turns/<int:turn_id>/cancel", views.api_board_cancel, name="api_cancel"),
    path("board/users/", views.users_page, name="users"),
    path("board/users/<int:user_id>/", views.user_action, name="user_action"),
    path("board/quotas/", views.quotas_page, name="quotas"),
    path("board/quotas/<int:quota_id>/", views.quotas_page, name="quota_edit"),
    path("board/quotas/<int:quota_id>/delete", views.quota_delete, name="quota_delete"),
    path("board/audit/", views.audit_page, name="audit"),
    path("usage/", views.usage_page, name="usage"),
    path("usage.csv", views.usage_csv, name="usage_csv"),
]
