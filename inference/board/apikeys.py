"""Per-user API keys for the OpenAI-compatible API: create (the key is returned once), list, revoke, authenticate.

A key is ``rdk_`` + 43 URL-safe characters (32 random bytes). Only its SHA-256 is stored, and a request's key is
found by that digest, so the database never holds a usable key.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import re
import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser, User
from django.db import transaction
from django.db.models import Count, QuerySet, Sum
from django.utils import timezone

from inference.audit import audit_record
from inference.db import lock_rows
from inference.errors import InvalidInput, NotFound
from inference.models import ApiKey, Turn
from inference.turns.lifecycle import turn_cancel
from rigdash.access import may_act_on, staff_now

KEY_PREFIX = "rdk_"
KEY_RE = re.compile(r"rdk_[A-Za-z0-9_-]{43}")
SHOWN_CHARS = 12  # "rdk_" and 8 more: enough to tell a user's keys apart, far too few to guess the rest
MAX_KEYS_PER_USER = 50  # active keys
MAX_EXPIRY_DAYS = 3650
LAST_USED_EVERY_S = 60  # last_used_at is written at most this often per key: not a write per request


def key_digest(raw_key: str) -> str:
    return hashlib.sha256(raw_key.encode()).hexdigest()


@dataclass(frozen=True)
class NewKey:
    key: ApiKey
    secret: str  # the whole key: shown to its owner once, never stored


def api_key_create(*, owner: AbstractBaseUser, name: str, expires_in_days: int | None = None,
                   storage: str = ApiKey.Storage.CHATS) -> NewKey:  # fmt: skip
    """A new key for ``owner``; the secret is in the result and nowhere else. ``storage``: whether its requests are
    kept as chats in the chat list, or nothing of their texts is kept once answered (``ApiKey.Storage``)."""
    if storage not in ApiKey.Storage.values:
        raise InvalidInput("invalid_storage", "Choose whether the key's requests are kept as chats or not stored.")
    name = (name or "").strip()
    if not name or len(name) > 100:
        raise InvalidInput("invalid_name", "Name the key (1-100 characters), e.g. the tool that will use it.")
    if expires_in_days is not None and not 1 <= expires_in_days <= MAX_EXPIRY_DAYS:
        raise InvalidInput("invalid_expiry", f"A key expires in 1 to {MAX_EXPIRY_DAYS} days, or never.")
    now = timezone.now()
    with transaction.atomic():
        lock_rows(User.objects.filter(pk=owner.pk))  # one create at a time per user: the cap holds
        if _active(ApiKey.objects.filter(owner_id=owner.pk), now).count() >= MAX_KEYS_PER_USER:
            raise InvalidInput("too_many_keys", f"You have {MAX_KEYS_PER_USER} active keys: revoke one first.")
        secret = KEY_PREFIX + secrets.token_urlsafe(32)
        key = ApiKey.objects.create(
            owner_id=owner.pk,
            name=name,
            prefix=secret[:SHOWN_CHARS],
            key_sha256=key_digest(secret),
            expires_at=now + timedelta(days=expires_in_days) if expires_in_days else None,
            storage=storage,
        )
    return NewKey(key=key, secret=secret)


def api_key_list_for(user: AbstractBaseUser) -> QuerySet[ApiKey]:
    return ApiKey.objects.filter(owner_id=user.pk).select_related("revoked_by")


def api_key_list_all() -> QuerySet[ApiKey]:
    """Every user's keys (for staff)."""
    return ApiKey.objects.select_related("owner", "revoked_by")


def api_key_revoke(*, key_id: int, actor: AbstractBaseUser | AnonymousUser) -> ApiKey:
    """Revoke a key: its owner may, and staff may revoke the keys of those below their role (audited; a key of
    someone at or above it: InvalidInput("forbidden")). Anyone else: NotFound."""
    if not actor.is_authenticated:
        raise NotFound("key")
    admin = staff_now(actor)
    keys = ApiKey.objects.all() if admin else ApiKey.objects.filter(owner_id=actor.pk)
    key = keys.filter(pk=key_id).select_related("owner").first()
    if key is None:
        raise NotFound("key")
    if not may_act_on(admin or actor, key.owner, own=True):
        raise InvalidInput("forbidden", "You cannot revoke the key of an account whose role is at or above your own.")
    revoked = ApiKey.objects.filter(pk=key.pk, revoked_at__isnull=True)
    if revoked.update(revoked_at=timezone.now(), revoked_by_id=actor.pk):
        key.refresh_from_db()
        if key.owner_id != actor.pk:
            detail = {"owner": key.owner.get_username(), "name": key.name, "prefix": key.prefix}
            audit_record(actor=actor, action="apikey.revoke", target=f"apikey:{key.pk}", detail=detail)
        _key_turns_cancel(key)
    return key


def api_key_storage_set(*, key_id: int, storage: str, actor: AbstractBaseUser | AnonymousUser) -> ApiKey:
    """Change what is kept of an active key's requests (``ApiKey.Storage``), by its owner only: it is their texts'
    privacy, so not even staff may switch another's key to storing them. It applies to the requests submitted after
    it: a request's session keeps the choice it was made with; chats kept before are not wiped (their owner deletes
    them from the chat list), and texts wiped before do not come back. Anyone else: NotFound."""
    if not actor.is_authenticated:
        raise NotFound("key")
    key = ApiKey.objects.filter(pk=key_id, owner_id=actor.pk).first()
    if key is None:
        raise NotFound("key")
    if storage not in ApiKey.Storage.values:
        raise InvalidInput("invalid_storage", "Choose whether the key's requests are kept as chats or not stored.")
    if key.state(timezone.now()) != "active":
        raise InvalidInput("key_not_active", f"This key is {key.state(timezone.now())}: its requests are refused.")
    ApiKey.objects.filter(pk=key.pk).update(storage=storage)
    key.storage = storage
    return key


USAGE_DAYS = 30


@dataclass(frozen=True)
class KeyUsage:
    turns: int
    prompt_tokens: int
    output_tokens: int


def api_key_usage(keys: list[ApiKey], *, days: int = USAGE_DAYS) -> dict[int, KeyUsage]:
    """Each key's requests over the last ``days``: turns and tokens (one grouped query; a key with none is left out)."""
    since = timezone.now() - timedelta(days=days)
    rows = (
        Turn.objects.filter(session__api_key__in=[key.pk for key in keys], created_at__gte=since)
        .values("session__api_key")
        .annotate(turns=Count("id"), prompt=Sum("prompt_tokens"), output=Sum("output_tokens"))
        .order_by()
    )
    return {row["session__api_key"]: KeyUsage(row["turns"], row["prompt"] or 0, row["output"] or 0) for row in rows}


def api_keys_expired_cancel(*, now: datetime | None = None) -> list[int]:
    """The periodic pass (the beat's ``inference.api_keys_expire``): each key past its expiry, once, has its waiting
    and running requests cancelled, as revoking does (a request already refused at the key check never started).
    Returns the keys it applied expiry to. Two passes at once apply each key once (the conditional update)."""
    now = now or timezone.now()
    due = ApiKey.objects.filter(expires_at__isnull=False, expires_at__lte=now, expiry_applied_at__isnull=True)
    applied = []
    for key in due.order_by("expires_at")[:EXPIRY_BATCH]:
        if ApiKey.objects.filter(pk=key.pk, expiry_applied_at__isnull=True).update(expiry_applied_at=now):
            _key_turns_cancel(key)
            applied.append(key.pk)
    return applied


EXPIRY_BATCH = 500  # keys per pass: the next pass takes the rest


def _key_turns_cancel(key: ApiKey) -> None:
    """A revoked or expired key's requests waiting or running end as cancelled (their clients' streams end with
    them)."""
    for turn in Turn.objects.filter(session__api_key=key, status__in=Turn.ACTIVE).select_related("session"):
        with contextlib.suppress(InvalidInput):  # it ended meanwhile
            turn_cancel(turn=turn)


def _active(keys: QuerySet[ApiKey], now: datetime) -> QuerySet[ApiKey]:
    return keys.filter(revoked_at__isnull=True).exclude(expires_at__lte=now)


class KeyRejected(Exception):
    """A request's key is missing, malformed, unknown, revoked or expired, or its owner is inactive."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def api_key_authenticate(authorization: str, *, remembered: bool = False) -> ApiKey:
    """The active key of an ``Authorization: Bearer rdk_...`` header (with its owner), or KeyRejected.

    ``remembered``: a key this process found active within ``REMEMBER_S`` comes from memory, with no database read, as
    an *unconfirmed* key (``ApiKey.unconfirmed``): it may start nothing but an early backend request, which stores and
    publishes nothing (inference/queue/early.py). ``api_key_confirm`` reads its row before anything of the request is
    stored or answered, so a key revoked or expired a moment ago is refused as it is without memory."""
    digest = key_digest(_raw_key(authorization))
    if remembered:
        with _remembered_lock:
            found = _remembered.get(digest)
        if found is not None and time.monotonic() - found[0] < REMEMBER_S:
            key = copy.copy(found[1])  # this request's own: confirming it writes to it
            key.unconfirmed = True
            return key
    return _key_read(digest)


def api_key_confirm(key: ApiKey) -> ApiKey:
    """``key`` as its row says now, with its owner, once it is confirmed active (KeyRejected otherwise); a key read from
    the database already is returned as it is."""
    if not key.unconfirmed:
        return key
    confirmed = _key_read(key.key_sha256)
    key.unconfirmed = False  # the request's own copy: whoever holds it sees it confirmed
    return confirmed


REMEMBER_S = 300.0  # how long a key found active may start early requests from memory (each is still confirmed)
REMEMBER_KEYS = 4096  # the most keys remembered; the least recently found go first
_remembered: OrderedDict[str, tuple[float, ApiKey]] = OrderedDict()
_remembered_lock = threading.Lock()


def _raw_key(authorization: str) -> str:
    scheme, _, raw = (authorization or "").partition(" ")
    raw = raw.strip()
    if scheme.lower() != "bearer" or not raw:
        raise KeyRejected("You didn't provide an API key: send Authorization: Bearer <your RigDash API key>.")
    if not KEY_RE.fullmatch(raw):
        raise KeyRejected("Incorrect API key provided. Create one on your API keys page.")
    return raw


def _key_read(digest: str) -> ApiKey:
    """The database's word on the key with ``digest``; remembered while active, forgotten once refused."""
    try:
        key = _key_active(digest)
    except KeyRejected:
        with _remembered_lock:
            _remembered.pop(digest, None)
        raise
    with _remembered_lock:
        _remembered[digest] = (time.monotonic(), copy.copy(key))
        _remembered.move_to_end(digest)
        while len(_remembered) > REMEMBER_KEYS:
            _remembered.popitem(last=False)
    return key


def _key_active(digest: str) -> ApiKey:
    key = ApiKey.objects.select_related("owner").filter(key_sha256=digest).first()
    now = timezone.now()
    if key is None:
        raise KeyRejected("Incorrect API key provided. Create one on your API keys page.")
    if key.state(now) != "active":
        raise KeyRejected(f"This API key is {key.state(now)}.")
    if not key.owner.is_active:
        raise KeyRejected("This API key's account is deactivated.")
    if key.last_used_at is None or (now - key.last_used_at).total_seconds() >= LAST_USED_EVERY_S:
        ApiKey.objects.filter(pk=key.pk).update(last_used_at=now)
        key.last_used_at = now
    return key
