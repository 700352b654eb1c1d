from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("inference", "0011_sweeps")]

    operations = [
        migrations.CreateModel(
            name="UsageCsvMonth",
            fields=[
                ("month", models.DateField(primary_key=True, serialize=False)),
                ("user_ids", models.TextField()),
                ("names_md5", models.CharField(max_length=32)),
                ("body", models.TextField()),
            ],
        ),
    ]
