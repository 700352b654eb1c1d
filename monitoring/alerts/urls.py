from __future__ import annotations

from django.urls import path

from monitoring.alerts import views

app_name = "alerts"

urlpatterns = [
    path("", views.alerts_page, name="page"),
    path("<int:alert_id>/acknowledge", views.alert_acknowledge, name="acknowledge"),
    path("rules/new", views.rule_edit, name="rule_new"),
    path("rules/<int:rule_id>/", views.rule_edit, name="rule_edit"),
    path("rules/<int:rule_id>/delete", views.rule_delete, name="rule_delete"),
    path("channels/new", views.channel_edit, name="channel_new"),
    path("channels/<int:channel_id>/", views.channel_edit, name="channel_edit"),
    path("channels/<int:channel_id>/delete", views.channel_delete, name="channel_delete"),
    path("silences/new", views.silence_new, name="silence_new"),
    path("silences/<int:silence_id>/end", views.silence_end, name="silence_end"),
]
