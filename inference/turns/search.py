"""Search a user's chats by title and by the text of their messages and replies.

On PostgreSQL the words are matched with full-text search (``websearch_to_tsquery`` on the ``simple``
configuration, so any language's words match as typed, prefixes excepted); elsewhere (SQLite) a chat matches when
its title or a turn contains the query as typed, case-insensitively.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.contrib.postgres.search import SearchQuery, SearchVector
from django.db import connection
from django.db.models import Q, QuerySet

from inference.errors import InvalidInput
from inference.models import ChatSession, Turn

QUERY_MAX_CHARS = 200
RESULT_LIMIT = 50
SNIPPET_CHARS = 160


@dataclass(frozen=True)
class SearchHit:
    session: ChatSession
    snippet: str  # a stretch of a matching message or reply, or "" when only the title matched


def query_validate(raw: object) -> str:
    query = " ".join(raw.split()) if isinstance(raw, str) else ""
    if len(query) > QUERY_MAX_CHARS:
        raise InvalidInput("bad_query", f"The search has {len(query)} characters; the limit is {QUERY_MAX_CHARS}.")
    return query


def _matching_turns(user_id: Any, query: str) -> list[tuple[int, str, str]]:
    mine = Turn.objects.filter(session__owner_id=user_id)
    found: QuerySet[Turn]
    if connection.vendor == "postgresql":
        found = mine.annotate(document=SearchVector("user_text", "reply_text", config="simple")).filter(
            document=SearchQuery(query, config="simple", search_type="websearch")
        )
    else:
        found = mine.filter(Q(user_text__icontains=query) | Q(reply_text__icontains=query))
    rows = found.order_by("-created_at").values_list("session_id", "user_text", "reply_text")[: RESULT_LIMIT * 4]
    return list(rows)


def _title_matches(user_id: Any, query: str) -> list[int]:
    mine = ChatSession.objects.filter(owner_id=user_id)
    if connection.vendor == "postgresql":
        mine = mine.annotate(document=SearchVector("title", config="simple")).filter(
            Q(document=SearchQuery(query, config="simple", search_type="websearch")) | Q(title__icontains=query)
        )
    else:
        mine = mine.filter(title__icontains=query)
    return list(mine.values_list("pk", flat=True)[:RESULT_LIMIT])


def snippet(text: str, query: str) -> str:
    """About SNIPPET_CHARS of ``text`` around the first word of ``query`` it contains (its start if none)."""
    lowered = text.lower()
    at = -1
    for word in [query, *query.split()]:
        at = lowered.find(word.lower().strip('"'))
        if at >= 0:
            break
    start = max(0, at - SNIPPET_CHARS // 3) if at >= 0 else 0
    part = " ".join(text[start : start + SNIPPET_CHARS].split())
    return ("…" if start else "") + part + ("…" if start + SNIPPET_CHARS < len(text) else "")


def session_search(user: AbstractBaseUser | AnonymousUser, query: str) -> list[SearchHit]:
    """The user's chats that match, most recently used first, each with a snippet of what matched."""
    if not query:
        return []
    snippets: dict[int, str] = {}
    for session_id, user_text, reply_text in _matching_turns(user.pk, query):
        if session_id not in snippets:
            text = reply_text if query.lower() in reply_text.lower() else user_text
            snippets[session_id] = snippet(text, query)
    ids = set(snippets) | set(_title_matches(user.pk, query))
    sessions = ChatSession.objects.filter(owner_id=user.pk, pk__in=ids, hidden=False).select_related("rig")
    sessions = sessions[:RESULT_LIMIT]
    return [SearchHit(session=session, snippet=snippets.get(session.pk, "")) for session in sessions]
