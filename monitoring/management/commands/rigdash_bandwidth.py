"""Measure this host's memory bandwidth for a rig, or set it by hand (GB/s) for a remote rig."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from inference.models import Rig
from monitoring import services
from monitoring.models import RigProfile


class Command(BaseCommand):
    help = "Measure (on this host) or set a rig's memory bandwidth, used for the decode roofline."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("rig", help="rig name")
        parser.add_argument("--set", type=float, dest="gbs", help="set this bandwidth (GB/s) instead of measuring")

    def handle(self, *args: Any, **options: Any) -> None:
        rig = Rig.objects.filter(name=options["rig"]).first()
        if rig is None:
            raise CommandError(f"no rig named {options['rig']!r}")
        if options["gbs"] is not None:
            if not 0.1 <= options["gbs"] <= 20_000:
                raise CommandError("bandwidth must be between 0.1 and 20000 GB/s")
            profile = services.profile_for(rig)
            profile.bandwidth_gbs = options["gbs"]
            profile.bandwidth_source = RigProfile.BandwidthSource.SETTING
            profile.save()
        else:
            profile = services.rig_bandwidth_measure(rig=rig)
        self.stdout.write(f"{rig.name}: {profile.bandwidth_gbs} GB/s ({profile.get_bandwidth_source_display()})")
