from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("inference", "0006_scale_indexes")]

    operations = [
        migrations.AddField(
            model_name="turn",
            name="thinking_text",
            field=models.TextField(blank=True, default=""),
        ),
    ]
