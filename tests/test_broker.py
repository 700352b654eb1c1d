"""RigDash's Celery transport (rigdash/broker.py) against the real Redis: one client object per channel for its
commands, and messages that still arrive whole and in order."""

from __future__ import annotations

import base64
import json

import redis
from django.conf import settings

from rigdash import broker
from rigdash.celery import app


def test_a_channel_builds_one_command_client_and_its_messages_arrive_in_order(monkeypatch):
    built: list[object] = []
    real_create = broker.Channel._create_client

    def counting_create(self: broker.Channel, asynchronous: bool = False) -> object:
        client = real_create(self, asynchronous=asynchronous)
        if not asynchronous:  # the consumer's own client (kombu's ``Channel.client``) is built once anyway
            built.append(client)
        return client

    monkeypatch.setattr(broker.Channel, "_create_client", counting_create)
    queue = "rigdash.test.broker"
    raw = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    raw.delete(queue)
    with app.connection_for_write() as connection:
        assert isinstance(connection.transport, broker.Transport)
        producer = connection.Producer()
        for n in range(3):
            producer.publish({"n": n}, exchange="", routing_key=queue, serializer="json")
    assert len(built) == 1, "a client object was built per command"
    bodies = [json.loads(base64.b64decode(json.loads(item)["body"])) for item in reversed(raw.lrange(queue, 0, -1))]
    assert bodies == [{"n": 0}, {"n": 1}, {"n": 2}]
    raw.delete(queue)
