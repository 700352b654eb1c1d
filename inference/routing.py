from __future__ import annotations

from django.urls import path

from inference.consumers import ChatConsumer, RigModelsConsumer
from inference.consumers_board import BoardConsumer

websocket_urlpatterns = [
    path("ws/chat/<int:session_id>/", ChatConsumer.as_asgi()),
    path("ws/rigs/<int:rig_id>/models/", RigModelsConsumer.as_asgi()),
    path("ws/board/", BoardConsumer.as_asgi()),  # admin board (staff only)
]
