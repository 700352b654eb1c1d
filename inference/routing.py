from __future__ import annotations

from django.urls import path

from inference.consumers import ChatConsumer
from inference.consumers_board import BoardConsumer

websocket_urlpatterns = [path("ws/chat/<int:session_id>/", ChatConsumer.as_asgi())]
websocket_urlpatterns += [path("ws/board/", BoardConsumer.as_asgi())]  # admin board (staff only)
