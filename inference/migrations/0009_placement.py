import django.db.models.deletion
from django.db import migrations, models
from django.db.models import OuterRef, Subquery


def turns_keep_their_rig(apps, schema_editor):
    """Every turn so far ran on its chat's rig."""
    Turn = apps.get_model("inference", "Turn")
    ChatSession = apps.get_model("inference", "ChatSession")
    Turn.objects.filter(rig__isnull=True).update(
        rig_id=Subquery(ChatSession.objects.filter(pk=OuterRef("session_id")).values("rig_id")[:1])
    )


class Migration(migrations.Migration):
    dependencies = [("inference", "0008_chat_settings")]

    operations = [
        migrations.AddField(
            model_name="rig",
            name="models_served",
            field=models.JSONField(blank=True, default=list, editable=False),
        ),
        migrations.AddField(
            model_name="chatsession",
            name="placement",
            field=models.CharField(
                choices=[("rig", "this rig"), ("model", "any rig serving the model")], default="rig", max_length=8
            ),
        ),
        migrations.AddField(
            model_name="turn",
            name="rig",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="turns",
                to="inference.rig",
            ),
        ),
        migrations.RunPython(turns_keep_their_rig, migrations.RunPython.noop),
    ]
