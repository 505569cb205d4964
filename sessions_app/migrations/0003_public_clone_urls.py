"""Sessions created before issue 8 stored the mirror's URL (a host path when the mirror is a
directory) as `clone_url`; the API now shows the repository's public clone URL."""

from django.db import migrations


def to_public_clone_urls(apps, schema_editor) -> None:
    Session = apps.get_model("sessions_app", "Session")
    stale = Session.objects.exclude(repo_owner__isnull=True).exclude(repo_name__isnull=True)
    for session in stale.exclude(clone_url__startswith="https://github.com/").iterator():
        session.clone_url = f"https://github.com/{session.repo_owner}/{session.repo_name}.git"
        session.save(update_fields=["clone_url"])


class Migration(migrations.Migration):
    dependencies = [
        ("sessions_app", "0002_session_lifecycle_dispatched_at_session_sweep_idle_and_more")
    ]

    operations = [migrations.RunPython(to_public_clone_urls, migrations.RunPython.noop)]
