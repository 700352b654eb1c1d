import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    """Usage per API key: UsageDay gains the key (none for the chat pages), unique per (day, user, model, key)."""

    dependencies = [
        ("inference", "0017_apikey_storage_expiry"),
    ]

    operations = [
        migrations.RemoveConstraint(model_name="usageday", name="usage_day_user_model"),
        migrations.AddField(
            model_name="usageday",
            name="api_key",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="+",
                to="inference.apikey",
            ),
        ),
        migrations.AddConstraint(
            model_name="usageday",
            constraint=models.UniqueConstraint(
                condition=models.Q(("api_key__isnull", True)),
                fields=("day", "user", "model_name"),
                name="usage_day_user_model_nokey",
            ),
        ),
        migrations.AddConstraint(
            model_name="usageday",
            constraint=models.UniqueConstraint(
                condition=models.Q(("api_key__isnull", False)),
                fields=("day", "user", "model_name", "api_key"),
                name="usage_day_user_model_key",
            ),
        ),
    ]
