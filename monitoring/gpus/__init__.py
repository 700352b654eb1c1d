"""GPUs of every vendor behind one call: ``gpus()`` asks each vendor module in ``VENDORS`` and returns typed readings.

A vendor module has ``VENDOR`` (its name) and ``read(pid) -> list[GpuReading]``, raising
``monitoring.collectors.Unavailable`` where its driver or tool is not on this host. Adding a vendor is one module and
one line in ``VENDORS`` (docs/architecture.md, "Where does a new GPU vendor go").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import ModuleType

from monitoring.collectors import Unavailable
from monitoring.gpus import amd, apple, nvidia
from monitoring.gpus.reading import GpuReading

VENDORS: tuple[ModuleType, ...] = (nvidia, amd, apple)


@dataclass(frozen=True)
class GpuSurvey:
    """What every vendor module found: the readings, and why each vendor that found nothing did not."""

    readings: list[GpuReading] = field(default_factory=list)
    absent: dict[str, str] = field(default_factory=dict)  # vendor -> why nothing was read

    @property
    def why_none(self) -> str:
        reasons = "; ".join(f"{vendor}: {why}" for vendor, why in self.absent.items())
        return f"no GPU found ({reasons})" if reasons else "no GPU found"


def gpus(pid: int | None = None) -> GpuSurvey:
    """Every GPU on this host, each vendor's in its own order; ``pid``: the process whose memory each GPU reports."""
    survey = GpuSurvey()
    for vendor in VENDORS:
        try:
            survey.readings.extend(vendor.read(pid))
        except Unavailable as exc:
            survey.absent[vendor.VENDOR] = str(exc)
    return survey


__all__ = ["VENDORS", "GpuReading", "GpuSurvey", "gpus"]
