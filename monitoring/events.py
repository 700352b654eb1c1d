"""Every message that reaches a monitoring browser is built and sent here.

Groups: ``monitoring.rig.<id>`` (a rig's dashboard) and ``monitoring.overview`` (all rigs).
Event types: ``rig.sample`` — one sample of a rig (series and detail, see monitoring.sampling).
"""

from __future__ import annotations

from typing import Any

from inference import events as inference_events
from inference.event_types import RigSample

OVERVIEW_GROUP = "monitoring.overview"


def rig_group(rig_id: int) -> str:
    return f"monitoring.rig.{rig_id}"


def rig_sample_sync(*, rig_id: int, sample: dict[str, Any]) -> None:
    """From the sampler's database thread: the rig's dashboards and the overview, in one pipelined round trip."""
    event = RigSample(type="rig.sample", rig=rig_id, sample=sample)
    inference_events.send_sync((rig_group(rig_id), event), (OVERVIEW_GROUP, event))
