from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("inference", "0020_rig_server_slots"),
    ]

    operations = [
        migrations.AddField(
            model_name="rig",
            name="server_models_max",
            field=models.PositiveSmallIntegerField(blank=True, editable=False, null=True),
        ),
    ]
