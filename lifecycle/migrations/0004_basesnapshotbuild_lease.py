from django.db import migrations, models
from django.utils import timezone


def lease_running_builds(apps, schema_editor):
    # Builds running before heartbeats existed get a lease that runs out at once: the next
    # sweep reaps them if their worker is gone (it cannot renew), as the old grace would have.
    Build = apps.get_model("lifecycle", "BaseSnapshotBuild")
    Build.objects.filter(status="running", lease_expires_at__isnull=True).update(
        lease_expires_at=timezone.now()
    )


class Migration(migrations.Migration):
    dependencies = [
        ("lifecycle", "0003_basesnapshotbuild"),
    ]

    operations = [
        migrations.AddField(
            model_name="basesnapshotbuild",
            name="lease_expires_at",
            field=models.DateTimeField(
                blank=True, help_text="a running build's heartbeat lease; past it, reaped", null=True
            ),
        ),
        migrations.RunPython(lease_running_builds, migrations.RunPython.noop),
    ]
