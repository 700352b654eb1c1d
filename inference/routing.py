from __future__ import annotations

from django.urls import path

from inference.consumers import ChatConsumer, RigModelsConsumer

websocket_urlpatterns = [
    path("ws/chat/<int:session_id>/", ChatConsumer.as_asgi()),
    path("ws/rigs/<int:rig_id>/models/", RigModelsConsumer.as_asgi()),
]
