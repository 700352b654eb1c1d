"""The rigs the environment names (rigdash_bootstrap): created on the first start, then owned by the admins.

Each start, a rig's ``base_url`` and ``slots`` follow the environment only while they still hold the values the
environment set last time (kept in ``Rig.bootstrapped``): once an admin edits one in /admin/, it stays as edited.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction

from inference.models import Rig

FOLLOWED = ("base_url", "slots")


def rig_from_env(*, name: str, kind: str, base_url: str, slots: int, is_default: bool = False) -> tuple[Rig, list[str]]:
    """Create the rig, or move the fields the admins left alone to the environment's values.

    Returns the rig and the fields kept because an admin changed them (the caller says so in its log).
    """
    wanted: dict[str, Any] = {"base_url": base_url, "slots": slots}
    with transaction.atomic():
        rig = Rig.objects.select_for_update().filter(name=name).first()
        if rig is None:
            rig = Rig(name=name, kind=kind, is_default=is_default, bootstrapped=wanted, **wanted)
            rig.full_clean()
            rig.save()
            return rig, []
        last = rig.bootstrapped or {}
        kept, changed = [], []
        for field in FOLLOWED:
            current = getattr(rig, field)
            # No record (a rig bootstrapped before this rule): it followed the environment, so it still does.
            if field in last and last[field] != current:
                kept.append(field)
            elif current != wanted[field]:
                setattr(rig, field, wanted[field])
                changed.append(field)
        if changed:
            rig.full_clean(exclude=["name", "queue"])
        recorded = {**last, **wanted}
        if changed or recorded != last:
            rig.bootstrapped = recorded
            rig.save(update_fields=[*changed, "bootstrapped"])
    return rig, kept
