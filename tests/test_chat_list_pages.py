"""The chat list a page at a time: every chat of the owner reachable once, newest first, by a cursor that costs the
same queries on any page; a cursor that is not one shows the newest chats and says so."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from inference.models import ChatSession, Rig
from inference.turns.selectors import CHAT_PAGE

OWN = 2 * CHAT_PAGE + 50


@pytest.fixture
def many_chats(owner: Any, other_user: Any) -> list[int]:
    """OWN chats of the owner (newest first by id order below) and a few of another user's, interleaved in time.
    Five of the owner's share one updated_at across the first page's end, so the id must break the tie."""
    rig = Rig.objects.create(name="pages-rig", kind=Rig.Kind.LLAMACPP, base_url="http://127.0.0.1:9")  # never asked
    mine = ChatSession.objects.bulk_create(
        ChatSession(owner=owner, rig=rig, model_name="m", title=f"chat {n}") for n in range(OWN)
    )
    theirs = ChatSession.objects.bulk_create(
        ChatSession(owner=other_user, rig=rig, model_name="m", title=f"theirs {n}") for n in range(5)
    )
    now = timezone.now()
    for rank, chat in enumerate(mine):  # mine[0] newest
        tie = CHAT_PAGE - 3 <= rank <= CHAT_PAGE + 1
        at = now - timedelta(minutes=CHAT_PAGE - 3 if tie else rank)
        ChatSession.objects.filter(pk=chat.pk).update(updated_at=at)
    for n, chat in enumerate(theirs):
        ChatSession.objects.filter(pk=chat.pk).update(updated_at=now - timedelta(minutes=n * 40, seconds=30))
    return list(ChatSession.objects.filter(owner=owner).order_by("-updated_at", "-pk").values_list("pk", flat=True))


def _listed(html: str) -> list[int]:
    section = html.split('data-testid="session-list"', 1)[1].split("</ul>", 1)[0]
    return [int(pk) for pk in re.findall(r'href="/sessions/(\d+)/"', section)]


def _older(html: str) -> str | None:
    found = re.search(r'href="/\?before=([^"]+)" data-testid="chats-older"', html)
    return found.group(1) if found else None


@pytest.mark.django_db
def test_every_chat_is_on_one_page_newest_first_and_each_page_costs_the_same(owner: Any, many_chats: list[int]):
    client = Client()
    client.force_login(owner)
    seen: list[int] = []
    queries: list[int] = []
    url = "/"
    while url:
        with CaptureQueriesContext(connection) as captured:
            response = client.get(url)
        assert response.status_code == 200
        html = response.content.decode()
        page = _listed(html)
        assert len(page) == (CHAT_PAGE if len(seen) + CHAT_PAGE <= OWN else OWN - len(seen))
        seen += page
        queries.append(len(captured))
        assert ('data-testid="chats-newest"' in html) == (url != "/")
        cursor = _older(html)
        url = f"/?before={cursor}" if cursor else ""
    assert seen == many_chats  # each of the owner's chats once, in order; none of the other user's
    assert len(queries) == 3 and len(set(queries)) == 1


@pytest.mark.django_db
@pytest.mark.parametrize("cursor", ["abc", "1-", "-5", "12-0", "99999999999999999999-1", "5-1e3", "٣-1"])
def test_a_cursor_that_is_not_one_shows_the_newest_chats_and_says_so(owner: Any, many_chats: list[int], cursor: str):
    client = Client()
    client.force_login(owner)
    response = client.get("/", {"before": cursor})
    assert response.status_code == 200
    html = response.content.decode()
    assert _listed(html) == many_chats[:CHAT_PAGE]
    assert "That page of chats does not exist" in html
    assert 'data-testid="chats-newest"' not in html


@pytest.mark.django_db
def test_the_other_users_cursor_shows_only_your_own_chats(owner: Any, other_user: Any, many_chats: list[int]):
    """A cursor is a position in time, not a permission: the owner's cursor given to another user lists theirs."""
    client = Client()
    client.force_login(owner)
    cursor = _older(client.get("/").content.decode())
    assert cursor
    other = Client()
    other.force_login(other_user)
    listed = _listed(other.get("/", {"before": cursor}).content.decode())
    assert listed and set(listed) <= set(ChatSession.objects.filter(owner=other_user).values_list("pk", flat=True))
