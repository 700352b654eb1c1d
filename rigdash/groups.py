"""Channel-layer group names that more than one package joins or sends to (no imports: safe before Django is set up)."""

from __future__ import annotations


def user_group(user_id: int) -> str:
    """Every socket of a user joins this group: ``user.revoked`` (inference/events.py) reaches them all."""
    return f"user.{user_id}"
