from __future__ import annotations

from django.urls import path

from monitoring.consumers import RigMonitorConsumer, SweepConsumer

websocket_urlpatterns = [
    path("ws/monitoring/", RigMonitorConsumer.as_asgi()),
    path("ws/monitoring/rigs/<int:rig_id>/", RigMonitorConsumer.as_asgi()),
    path("ws/monitoring/sweeps/<int:sweep_id>/", SweepConsumer.as_asgi()),
]
