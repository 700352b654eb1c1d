import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models
from django.db.models import Max


def from_history(apps, schema_editor):
    """One row per user and rig: the latest hand-out among their turns so far."""
    Turn = apps.get_model("inference", "Turn")
    LastServed = apps.get_model("inference", "LastServed")
    latest = (
        Turn.objects.filter(dispatched_at__isnull=False, rig__isnull=False)
        .values("rig_id", "session__owner_id")
        .annotate(at=Max("dispatched_at"))
        .order_by()
    )
    rows = (LastServed(rig_id=r["rig_id"], user_id=r["session__owner_id"], at=r["at"]) for r in latest.iterator())
    batch: list = []
    for row in rows:
        batch.append(row)
        if len(batch) == 5000:
            LastServed.objects.bulk_create(batch)
            batch = []
    LastServed.objects.bulk_create(batch)


class Migration(migrations.Migration):
    dependencies = [
        ("inference", "0009_placement"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="LastServed",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("at", models.DateTimeField()),
                (
                    "rig",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE, related_name="+", to="inference.rig"
                    ),
                ),
                (
                    "user",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE, related_name="+", to=settings.AUTH_USER_MODEL
                    ),
                ),
            ],
            options={
                "constraints": [models.UniqueConstraint(fields=("rig", "user"), name="last_served_rig_user")],
            },
        ),
        migrations.RunPython(from_history, migrations.RunPython.noop),
    ]
