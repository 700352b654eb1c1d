"""Sign-in through the provider: the account a subject signs in as, created at first sign-in, its role set from the
groups it has now (so a group removed at the provider demotes at the next sign-in)."""

from __future__ import annotations

import hashlib
import logging
import re
from typing import TYPE_CHECKING, Any

from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.utils import timezone

from rigdash.access import ROLE_STAFF, ROLE_SUPERUSER
from rigdash.sso.config import OidcConfig
from rigdash.sso.models import ExternalIdentity
from rigdash.sso.roles import groups_of, role_for

if TYPE_CHECKING:
    from django.contrib.auth.models import User

logger = logging.getLogger(__name__)
USERNAME_MAX = 150


def sso_user_sign_in(
    *, config: OidcConfig, issuer: str, claims: dict[str, Any], retry_race: bool = True
) -> User | None:
    """The active account ``claims["sub"]`` at ``issuer`` signs in as, with its role set; None when refused (no
    mapped group, or an account made inactive in RigDash)."""
    subject = str(claims["sub"])
    role = role_for(config, subject=subject, groups=groups_of(claims, config.groups_claim))
    if role is None:
        logger.warning("sso: %s at %s refused: in none of the user, staff or superuser groups", subject, issuer)
        return None
    try:
        with transaction.atomic():
            user = _account_of(config, issuer=issuer, subject=subject, claims=claims)
            if not user.is_active:
                logger.warning("sso: %s at %s refused: account %s is inactive", subject, issuer, user.username)
                return None
            _set_role(user, role=role, email=str(claims.get("email") or user.email))
    except IntegrityError:  # the same subject's first sign-in, twice at once: the other one created the account
        if not retry_race:
            raise
        return sso_user_sign_in(config=config, issuer=issuer, claims=claims, retry_race=False)
    return user


def _account_of(config: OidcConfig, *, issuer: str, subject: str, claims: dict[str, Any]) -> User:
    identity = (
        ExternalIdentity.objects.select_for_update()
        .select_related("user")
        .filter(issuer=issuer, subject=subject)
        .first()
    )
    if identity is None:
        username = _free_username(_wanted_username(config, subject=subject, claims=claims), subject=subject)
        user: User = get_user_model().objects.create_user(username, email=str(claims.get("email") or ""))
        identity = ExternalIdentity.objects.create(user=user, issuer=issuer, subject=subject)
        logger.info("sso: created account %s for %s at %s", username, subject, issuer)
    identity.last_login_at = timezone.now()
    identity.save(update_fields=["last_login_at"])
    account: User = identity.user
    return account


def _set_role(user: User, *, role: int, email: str) -> None:
    """Save only what changed: a role change sends the user's sockets their re-check (inference/signals.py)."""
    wanted = {"is_staff": role >= ROLE_STAFF, "is_superuser": role == ROLE_SUPERUSER, "email": email}
    changed = [field for field, value in wanted.items() if getattr(user, field) != value]
    for field in changed:
        setattr(user, field, wanted[field])
    if changed:
        user.save(update_fields=changed)


def _wanted_username(config: OidcConfig, *, subject: str, claims: dict[str, Any]) -> str:
    for value in (claims.get(config.username_claim), str(claims.get("email") or "").partition("@")[0]):
        cleaned = re.sub(r"[^\w.@+-]", "", str(value or ""))[: USERNAME_MAX - 9]
        if cleaned:
            return cleaned
    return "sso-" + _short_hash(subject)


def _free_username(wanted: str, *, subject: str) -> str:
    """``wanted``, or ``wanted-<hash of the subject>`` when a local or other account has that name already."""
    users = get_user_model().objects
    if not users.filter(username__iexact=wanted).exists():
        return wanted
    return f"{wanted}-{_short_hash(subject)}"


def _short_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:8]
