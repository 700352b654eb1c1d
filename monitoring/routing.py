from __future__ import annotations

from django.urls import path

from monitoring.consumers import RigMonitorConsumer

websocket_urlpatterns = [
    path("ws/monitoring/", RigMonitorConsumer.as_asgi()),
    path("ws/monitoring/rigs/<int:rig_id>/", RigMonitorConsumer.as_asgi()),
]
