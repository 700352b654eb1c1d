"""Helpers for the admin, quota and fairness tests: users, sessions, turns (the board socket is in wsclient)."""

from __future__ import annotations

import time
from typing import Any

from channels.testing import WebsocketCommunicator


async def closed_with(comm: WebsocketCommunicator, timeout: float) -> int | None:
    """Wait for the server to close the socket; its close code (frames before it are skipped)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            output = await comm.receive_output(timeout=max(0.01, deadline - time.monotonic()))
        except TimeoutError:
            return None
        if output["type"] == "websocket.close":
            return int(output.get("code", 1000))
    return None


def make_user(username: str, **extra: Any) -> Any:
    from django.contrib.auth import get_user_model

    return get_user_model().objects.create_user(username=username, password=f"{username}-pw-123", **extra)


def make_session(owner: Any, rig: Any, model_name: str) -> Any:
    from inference.models import ChatSession

    return ChatSession.objects.create(owner=owner, rig=rig, model_name=model_name)


def quiet(rig: Any) -> Any:
    """Point the rig at a Celery queue no worker listens to: submitted turns are dispatched but never run."""
    rig.queue = f"rig.nobody-listens.{rig.pk}"
    rig.save(update_fields=["queue"])
    return rig
