"""The days rolled up before UsageDay had a key: each key's share moves into rows of its own, and the usage page's
and CSV's stored sums and months (written without keys) are dropped, to be written again when read."""

from collections import defaultdict
from datetime import UTC, datetime, time, timedelta

from django.db import migrations
from django.db.models import Case, Count, DurationField, F, Sum, When
from django.db.models.functions import Coalesce, TruncDate

SUMS = ("turns", "prompt_tokens", "output_tokens", "busy_s")


def _key_totals(Turn, days):
    """The turns made with a key, per (day, user, model, key), over the rolled-up days, as the rollup adds them up."""
    lo, hi = min(days), max(days)
    busy = Case(When(finished_at__gt=F("started_at"), then=F("finished_at") - F("started_at")),
                output_field=DurationField())  # fmt: skip
    rows = (
        Turn.objects.filter(
            session__api_key__isnull=False,
            created_at__gte=datetime.combine(lo, time.min, UTC) - timedelta(days=1),
            created_at__lt=datetime.combine(hi, time.min, UTC) + timedelta(days=1),
        )
        .annotate(day=TruncDate(Coalesce("started_at", "created_at"), tzinfo=UTC))
        .filter(day__gte=lo, day__lte=hi)
        .values("day", "session__owner_id", "session__model_name", "session__api_key_id")
        .annotate(n=Count("id"), prompt=Sum("prompt_tokens"), output=Sum("output_tokens"), busy=Sum(busy))
        .order_by()
    )
    groups = defaultdict(list)
    for r in rows.iterator():
        if r["day"] in days:
            busy_s = r["busy"].total_seconds() if r["busy"] else 0.0
            share = (r["n"], r["prompt"] or 0, r["output"] or 0, busy_s)
            groups[(r["day"], r["session__owner_id"], r["session__model_name"])].append(
                (r["session__api_key_id"], share)
            )
    return groups


def split_by_key(apps, schema_editor):
    """Move each key's turns that still exist out of its (day, user, model) row into a row of the key; the rest (the
    chat pages' turns, and turns deleted since, whose key is unknown) stays without a key. A row that its key turns add
    up to more than (a turn that waited days to start, counted on another day) is left whole."""
    UsageDay = apps.get_model("inference", "UsageDay")
    apps.get_model("inference", "UsageCsvMonth").objects.all().delete()
    apps.get_model("inference", "UsageRangeSums").objects.all().delete()
    days = set(apps.get_model("inference", "UsageRolledDay").objects.values_list("day", flat=True))
    if not days:
        return
    groups = _key_totals(apps.get_model("inference", "Turn"), days)
    by_day = defaultdict(list)
    for group in groups:
        by_day[group[0]].append(group)
    for day in sorted(by_day):
        stored = {(r.user_id, r.model_name): r for r in UsageDay.objects.filter(day=day, api_key__isnull=True)}
        new, changed, emptied = [], [], []
        for _, user_id, model in by_day[day]:
            row = stored.get((user_id, model))
            shares = groups[(day, user_id, model)]
            total = [sum(share[i] for _, share in shares) for i in range(4)]
            if row is None or any(total[i] > getattr(row, SUMS[i]) for i in range(3)):
                continue
            for key_id, (n, prompt, output, busy_s) in shares:
                new.append(UsageDay(day=day, user_id=user_id, model_name=model, api_key_id=key_id, turns=n,
                                    prompt_tokens=prompt, output_tokens=output, busy_s=round(busy_s, 3)))  # fmt: skip
            row.turns -= total[0]
            row.prompt_tokens -= total[1]
            row.output_tokens -= total[2]
            row.busy_s = max(0.0, round(row.busy_s - total[3], 3))
            (changed if row.turns else emptied).append(row)
        UsageDay.objects.bulk_create(new, batch_size=2000)
        UsageDay.objects.bulk_update(changed, SUMS, batch_size=2000)
        UsageDay.objects.filter(pk__in=[row.pk for row in emptied]).delete()


def merge_keys(apps, schema_editor):
    """Back to one row per (day, user, model): each key's rows added into the row without a key."""
    UsageDay = apps.get_model("inference", "UsageDay")
    apps.get_model("inference", "UsageCsvMonth").objects.all().delete()
    apps.get_model("inference", "UsageRangeSums").objects.all().delete()
    keyed = (
        UsageDay.objects.filter(api_key__isnull=False)
        .values("day", "user_id", "model_name")
        .annotate(t=Sum("turns"), p=Sum("prompt_tokens"), o=Sum("output_tokens"), b=Sum("busy_s"))
        .order_by()
    )
    for r in list(keyed):
        row, _ = UsageDay.objects.get_or_create(day=r["day"], user_id=r["user_id"], model_name=r["model_name"],
                                                api_key=None)  # fmt: skip
        UsageDay.objects.filter(pk=row.pk).update(
            turns=F("turns") + r["t"], prompt_tokens=F("prompt_tokens") + r["p"],
            output_tokens=F("output_tokens") + r["o"], busy_s=F("busy_s") + r["b"],
        )  # fmt: skip
    UsageDay.objects.filter(api_key__isnull=False).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("inference", "0018_usageday_api_key"),
    ]

    operations = [
        migrations.RunPython(split_by_key, merge_keys),
    ]
