"""``{% rig_queue_warning rig %}``: a banner on pages that send turns to a rig no worker consumes."""

from __future__ import annotations

from typing import Any

from django import template

from inference.models import Rig
from monitoring.queues import consumers_nowait, rig_consumers

register = template.Library()


@register.inclusion_tag("monitoring/_rig_queue_warning.html", takes_context=True)
def rig_queue_warning(context: template.Context, rig: Rig) -> dict[str, Any]:
    """Shown when the workers' last answer (monitoring.queues, never waited for here) has none on the rig's queue."""
    found = consumers_nowait()
    request = context.get("request")
    is_staff = bool(request is not None and getattr(request.user, "is_staff", False))
    if found is None or found.error:
        return {"show": False}
    queue = rig_consumers([rig], found)[rig.name]
    return {"show": not queue["ok"], "rig": rig, "queue": queue["queue"], "is_staff": is_staff}
