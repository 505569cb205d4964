"""SNAPSHOT_STORAGE selects the snapshots storage at start-up, and refuses what cannot work,
naming the variable: each case is a fresh process reading its environment."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHOW = (
    "import django; django.setup(); from django.core.files.storage import storages; "
    "s = storages['snapshots']; print(type(s).__name__, getattr(s, 'bucket_name', '-'), "
    "getattr(s, 'endpoint_url', '-'), getattr(s, 'region_name', '-'), repr(s.location), "
    "getattr(s, 'addressing_style', '-'))"
)


def start(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SNAPSHOT_")}
    return subprocess.run(
        [sys.executable, "-c", SHOW],
        cwd=ROOT,
        env={
            **clean,
            "DJANGO_SETTINGS_MODULE": "recoup.settings",
            "RECOUP_DATA_DIR": str(tmp_path),
            **env,
        },
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_snapshots_stay_on_the_filesystem_by_default(tmp_path):
    shown = start(tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.split()[0] == "FileSystemStorage"
    assert str(tmp_path / "snapshots") in shown.stdout


def test_s3_is_selected_with_its_bucket_endpoint_region_and_prefix(tmp_path):
    shown = start(
        tmp_path,
        SNAPSHOT_STORAGE="s3",
        SNAPSHOT_S3_BUCKET="snaps",
        SNAPSHOT_S3_ENDPOINT_URL="http://minio:9000",
        SNAPSHOT_S3_REGION="eu-west-1",
        SNAPSHOT_S3_PREFIX="/recoup/prod/",
    )
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.split() == [
        "S3Storage",
        "snaps",
        "http://minio:9000",
        "eu-west-1",
        "'recoup/prod'",
        "path",
    ]


@pytest.mark.parametrize(
    "env, named",
    [
        ({"SNAPSHOT_STORAGE": "gcs"}, "SNAPSHOT_STORAGE must be one of filesystem, s3"),
        ({"SNAPSHOT_STORAGE": "s3"}, "SNAPSHOT_S3_BUCKET"),
        (
            {
                "SNAPSHOT_STORAGE": "s3",
                "SNAPSHOT_S3_BUCKET": "b",
                "SNAPSHOT_S3_ENDPOINT_URL": "minio:9000",
            },
            "SNAPSHOT_S3_ENDPOINT_URL must be an http(s):// URL",
        ),
        (
            {
                "SNAPSHOT_STORAGE": "s3",
                "SNAPSHOT_S3_BUCKET": "b",
                "SNAPSHOT_STORAGE_BACKEND": "django.core.files.storage.InMemoryStorage",
            },
            "not both",
        ),
    ],
)
def test_a_snapshot_storage_that_cannot_work_stops_the_start(tmp_path, env, named):
    shown = start(tmp_path, **env)
    assert shown.returncode != 0
    assert "ImproperlyConfigured" in shown.stderr and named in shown.stderr


def test_another_storage_backend_is_still_taken_by_its_dotted_path(tmp_path):
    shown = start(tmp_path, SNAPSHOT_STORAGE_BACKEND="django.core.files.storage.InMemoryStorage")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.split()[0] == "InMemoryStorage"
