"""When people work: hour weights over the year (weekdays, office hours, a team that grows)."""

from __future__ import annotations

import bisect
import itertools
import random
from datetime import datetime, timedelta

HOUR_OF_DAY = [0.05, 0.03, 0.02, 0.02, 0.03, 0.08, 0.2, 0.5, 0.9, 1.0, 1.0, 0.95,
               0.8, 0.9, 1.0, 1.0, 0.9, 0.7, 0.5, 0.4, 0.3, 0.25, 0.15, 0.08]  # fmt: skip


class Timeline:
    """Draws instants in (now - days, now], weighted by hour of day, weekday and a linear growth (x3 over the
    range)."""

    def __init__(self, now: datetime, days: int) -> None:
        self.now = now
        self.start = (now - timedelta(days=days)).replace(minute=0, second=0, microsecond=0)
        hours = int((now - self.start).total_seconds() // 3600)
        weights = []
        for h in range(hours):
            moment = self.start + timedelta(hours=h)
            weekday = 1.0 if moment.weekday() < 5 else 0.2
            weights.append(HOUR_OF_DAY[moment.hour] * weekday * (0.5 + h / max(hours, 1)))
        self.cumulative = list(itertools.accumulate(weights))

    def weight_at(self, moment: datetime) -> float:
        """The relative activity of the hour holding ``moment`` (0..~1.5)."""
        h = int((moment - self.start).total_seconds() // 3600)
        if not 0 <= h < len(self.cumulative):
            return 0.0
        return self.cumulative[h] - (self.cumulative[h - 1] if h else 0.0)

    def draw(self, rng: random.Random) -> datetime:
        h = bisect.bisect_left(self.cumulative, rng.random() * self.cumulative[-1])
        return self.start + timedelta(hours=h, seconds=rng.random() * 3600)
