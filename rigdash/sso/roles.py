"""A provider's groups and subject to a RigDash role: plain data in, a role (rigdash.access) or a refusal out."""

from __future__ import annotations

from collections.abc import Iterable

from rigdash.access import ROLE_STAFF, ROLE_SUPERUSER, ROLE_USER
from rigdash.sso.config import OidcConfig


def role_for(config: OidcConfig, *, subject: str, groups: Iterable[str]) -> int | None:
    """The role a signed-in person gets, or None when no mapped group lets them in.

    Superuser only by an explicit group or subject; staff by a staff group; user by a user group, or by signing in at
    all when no user group is named."""
    held = set(groups)
    if subject in config.superuser_subjects or held & config.superuser_groups:
        return ROLE_SUPERUSER
    if held & config.staff_groups:
        return ROLE_STAFF
    if not config.user_groups or held & config.user_groups:
        return ROLE_USER
    return None


def groups_of(claims: dict[str, object], claim: str) -> list[str]:
    """The group names in ``claims[claim]``: a list of strings, or one string (some providers send one group so).

    Keycloak's group mapper may send full paths (``/rigdash/staff``); they are matched as written."""
    value = claims.get(claim)
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [item for item in value if isinstance(item, str)]
    return []
