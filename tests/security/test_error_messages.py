"""No host path reaches a client through an error message."""

from django.conf import settings

from sandboxes_app.git.commands import public_text


def test_provider_messages_name_no_host_path():
    message = (
        f"tar failed in {settings.SANDBOX_ROOT}/sbx-1/upper; "
        f"{settings.SNAPSHOT_STORAGE_ROOT}/sessions/x.tar.zst missing; "
        f"lock {settings.DATA_DIR}/broker busy"
    )

    text = public_text(message)

    assert str(settings.DATA_DIR) not in text
    assert text == (
        "tar failed in <sandboxes>/sbx-1/upper; <snapshots>/sessions/x.tar.zst missing; "
        "lock <data>/broker busy"
    )
