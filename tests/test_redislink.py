"""inference/live/link.py: the worker's batch writes on one connection of their own, against the real Redis.

What must hold: replies come back in order, each caller gets its own, batches queued together go in one round
trip, and a batch that fails part-way (an error reply, a cancelled task) never leaves a reply behind for the next
batch to read as its own."""

from __future__ import annotations

import asyncio
import time

import pytest
from redis import asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from inference.live.link import RedisLink
from inference.worker import loop as worker_loop
from inference.worker import pace


@pytest.fixture
async def redis_pair(settings):
    link, client = RedisLink(settings.REDIS_URL), aioredis.Redis.from_url(settings.REDIS_URL)
    prefix = f"rigdash:test:link:{time.monotonic_ns()}"
    try:
        yield link, client, prefix
    finally:
        keys = await client.keys(f"{prefix}*")
        if keys:
            await client.delete(*keys)
        await client.aclose()
        await link.aclose()


async def test_a_batch_appends_publishes_and_reads_in_one_round_trip_with_replies_in_order(redis_pair):
    link, client, prefix = redis_pair
    pubsub = client.pubsub()
    await pubsub.subscribe(f"{prefix}:chan")
    await pubsub.get_message(timeout=1)  # the subscribe confirmation
    await client.set(f"{prefix}:flag", "1")
    async with link.pipeline() as pipe:
        pipe.rpush(f"{prefix}:list", "a")
        pipe.expire(f"{prefix}:list", 60)
        pipe.publish(f"{prefix}:chan", "batch 1")
        pipe.get(f"{prefix}:flag")
        pipe.get(f"{prefix}:missing")
        replies = await pipe.execute()
    assert replies == [1, 1, 1, b"1", None]
    async with link.pipeline() as pipe:
        pipe.delete(f"{prefix}:list")
        pipe.rpush(f"{prefix}:list", "b", "c")
        assert await pipe.execute() == [1, 2]
    assert await client.lrange(f"{prefix}:list", 0, -1) == [b"b", b"c"]
    message = await pubsub.get_message(timeout=1)
    assert message is not None and message["data"] == b"batch 1"
    await pubsub.aclose()


async def test_an_error_reply_fails_its_batch_and_leaves_nothing_for_the_next(redis_pair):
    link, client, prefix = redis_pair
    await client.set(f"{prefix}:text", "not a list")
    with pytest.raises(ResponseError, match="WRONGTYPE"):
        async with link.pipeline() as pipe:
            pipe.rpush(f"{prefix}:text", "x")  # the error comes first; the GET's reply after it is read and dropped
            pipe.get(f"{prefix}:text")
            await pipe.execute()
    async with link.pipeline() as pipe:
        pipe.get(f"{prefix}:other")
        assert await pipe.execute() == [None]  # not b"not a list": the failed batch's replies went with it


async def test_batches_queued_in_one_pass_of_the_loop_share_one_round_trip_and_an_error_fails_only_its_own(
    redis_pair,
):
    """Sixteen turns' batches due at one tick: one write, each its own replies; the one whose RPUSH meets a key of
    the wrong type fails alone."""
    link, client, prefix = redis_pair
    await client.set(f"{prefix}:text", "not a list")
    before = link.round_trips

    async def batch(n: int) -> list[int]:
        key = f"{prefix}:text" if n == 5 else f"{prefix}:turn{n}"
        async with link.pipeline() as pipe:
            pipe.rpush(key, *(str(i) for i in range(n + 1)))
            pipe.publish(f"{prefix}:chan{n}", str(n))
            return await pipe.execute()

    results = await asyncio.gather(*(batch(n) for n in range(16)), return_exceptions=True)
    assert link.round_trips - before == 1
    assert isinstance(results[5], ResponseError)
    assert [r for n, r in enumerate(results) if n != 5] == [[n + 1, 0] for n in range(16) if n != 5]
    assert await client.llen(f"{prefix}:turn15") == 16


async def test_a_batch_cancelled_before_it_is_sent_never_runs_and_one_cancelled_on_its_way_leaves_nothing_behind(
    redis_pair,
):
    link, client, prefix = redis_pair
    on_its_way = asyncio.create_task(link.execute([("BLPOP", f"{prefix}:empty", 0.5)]))
    await asyncio.sleep(0.1)  # sent; Redis holds the reply for up to half a second
    queued = asyncio.create_task(link.execute([("RPUSH", f"{prefix}:never", "x")]))
    await asyncio.sleep(0.05)  # queued behind the round trip on its way
    queued.cancel()
    on_its_way.cancel()
    for task in (queued, on_its_way):
        with pytest.raises(asyncio.CancelledError):
            await task
    assert await link.execute([("GET", f"{prefix}:x")]) == [None]  # not BLPOP's None-or-list read as its own
    assert await client.exists(f"{prefix}:never") == 0


async def test_batches_of_turns_on_one_loop_take_turns_on_the_connection(redis_pair):
    link, _client, prefix = redis_pair

    async def turn(n: int) -> list[int]:
        lengths = []
        for i in range(20):
            async with link.pipeline() as pipe:
                pipe.rpush(f"{prefix}:turn{n}", str(i))
                pipe.publish(f"{prefix}:chan{n}", str(i))
                lengths.append((await pipe.execute())[0])
        return lengths

    results = await asyncio.gather(*(turn(n) for n in range(8)))
    assert all(lengths == list(range(1, 21)) for lengths in results)


async def test_a_redis_that_is_not_there_is_a_redis_error_and_the_link_connects_again_later(settings):
    link = RedisLink("redis://127.0.0.1:1/0")  # nothing listens on port 1
    with pytest.raises((RedisConnectionError, OSError)):
        await link.execute([("PING",)])
    with pytest.raises((RedisConnectionError, OSError)):
        await link.execute([("PING",)])  # tries again rather than reusing a broken state
    good = RedisLink(settings.REDIS_URL)
    try:
        assert await good.execute([("PING",)]) == [b"PONG"]  # raw replies: no redis-py callbacks
        assert await good.execute([]) == []
        with pytest.raises(ValueError):
            good.pipeline(transaction=True)
    finally:
        await good.aclose()


def test_replies_are_parsed_by_hiredis(settings):
    """pyproject asks for redis[hiredis]: redis-py's C parser halved the web's CPU per pub/sub message here and cut
    the link's batch (docs/changelog.md). Without it redis-py falls back to its Python parser silently."""
    from redis._parsers import _AsyncHiredisParser

    link = RedisLink(settings.REDIS_URL)
    assert isinstance(link._connection._parser, _AsyncHiredisParser)


def test_each_event_loop_gets_its_own_clients_and_they_go_with_the_loop(settings):
    """The runner's per-loop state (the Redis client, the batch link, the flush pace) is keyed by the loop itself.
    Keyed by ``id(loop)`` it outlived its loop, and a later loop given the same id (tests run one loop each) would
    have been handed a client bound to the dead one."""
    import gc

    async def clients() -> tuple[object, ...]:
        return worker_loop.redis_for_loop(), worker_loop.link_for_loop(), pace.pace_for_loop()

    def held() -> tuple[int, int, int]:
        return len(worker_loop._redis_clients), len(worker_loop._links), len(pace._paces)

    gc.collect()
    before = held()  # other loops of this process (earlier tests') may still hold theirs
    first = asyncio.run(clients())
    second = asyncio.run(clients())
    assert all(a is not b for a, b in zip(first, second, strict=True))
    del first, second
    gc.collect()
    assert held() == before
