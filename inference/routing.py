from __future__ import annotations

from django.urls import path

from inference.consumers.board import BoardConsumer
from inference.consumers.chat import ChatConsumer
from inference.consumers.models import RigModelsConsumer

websocket_urlpatterns = [
    path("ws/chat/<int:session_id>/", ChatConsumer.as_asgi()),
    path("ws/rigs/<int:rig_id>/models/", RigModelsConsumer.as_asgi()),
    path("ws/board/", BoardConsumer.as_asgi()),  # admin board (staff only)
]
