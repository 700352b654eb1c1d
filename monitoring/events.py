"""Every message that reaches a monitoring browser is built and sent here.

Groups: ``monitoring.rig.<id>`` (a rig's dashboard) and ``monitoring.overview`` (all rigs).
Event types: ``rig.sample`` — one sample of a rig (series and detail, see monitoring.sampling).
"""

from __future__ import annotations

from typing import Any

from channels.layers import get_channel_layer

OVERVIEW_GROUP = "monitoring.overview"


def rig_group(rig_id: int) -> str:
    return f"monitoring.rig.{rig_id}"


async def rig_sample(*, rig_id: int, sample: dict[str, Any]) -> None:
    layer = get_channel_layer()
    event = {"type": "rig.sample", "rig": rig_id, "sample": sample}
    await layer.group_send(rig_group(rig_id), event)
    await layer.group_send(OVERVIEW_GROUP, event)
