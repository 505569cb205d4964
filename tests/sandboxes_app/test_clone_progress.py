"""git's own progress, read from a real `git clone --progress` of a local origin."""

import os

import pytest

from sandboxes_app.git.commands import GitError, git_clone
from sandboxes_app.git.progress import CloneProgress


def test_a_clone_reports_git_percentages_that_never_go_back(origins, tmp_path):
    files = {f"blob{n}.bin": os.urandom(256 * 1024) for n in range(24)}
    files["README.md"] = "# big\n"
    origins.create("acme", "big", files)
    reports: list[tuple[str, int | None]] = []

    git_clone(
        url=f"{origins.base_url}/acme/big.git",
        dest=tmp_path / "clone",
        branch=None,
        progress=lambda phase, percent: reports.append((phase, percent)),
    )

    assert (tmp_path / "clone" / "README.md").read_text() == "# big\n"
    phases = [phase for phase, _ in reports]
    assert phases == sorted(phases, key=["cloning", "checkout"].index), phases
    for phase in ("cloning", "checkout"):
        percents = [percent for p, percent in reports if p == phase]
        assert len(percents) >= 3, reports
        assert percents == sorted(set(percents)) and all(0 <= p <= 100 for p in percents)
    assert max(p for phase, p in reports if phase == "cloning") >= 85  # the pack arrived
    assert reports[-1] == ("checkout", 100)


def test_a_failed_clone_with_progress_says_what_it_says_without(origins, tmp_path):
    """git's error, not its progress chatter, and the same refusal for a missing repository."""
    url = f"{origins.base_url}/acme/missing.git"
    with pytest.raises(GitError) as quiet:
        git_clone(url=url, dest=tmp_path / "a", branch=None)
    with pytest.raises(GitError) as reporting:
        git_clone(url=url, dest=tmp_path / "b", branch=None, progress=lambda *_: None)

    assert str(reporting.value) == str(quiet.value)
    assert "not found, or not readable" in str(reporting.value)

    origins.create("acme", "app", {"README.md": "x"})
    with pytest.raises(GitError) as no_branch:
        git_clone(
            url=f"{origins.base_url}/acme/app.git",
            dest=tmp_path / "c",
            branch="nope",
            progress=lambda *_: None,
        )
    assert "Remote branch nope not found" in str(no_branch.value)
    assert "%" not in str(no_branch.value) and "objects" not in str(no_branch.value)


def test_the_parser_reads_only_whole_lines_and_keeps_what_is_not_progress():
    reports: list[tuple[str, int | None]] = []
    parser = CloneProgress(lambda phase, percent: reports.append((phase, percent)))

    for chunk in [
        b"Cloning into 'x'...\nremote: Compressing objects:  50% (1/2)\r",
        b"Receiving objects:  5",  # half a line: nothing yet
        b"0% (5/10)\rReceiving objects: 100% (10/10), 1.00 MiB | done.\n",
        b"warning: remote HEAD refers to nonexistent ref\n",
        b"Resolving deltas:  40% (2/5)\rUpdating files:  30% (3/10)\r",
        b"Receiving objects:  90% (9/10)\r",  # out of order: ignored, never back to cloning
        b"Updating files:  20% (2/10)\rUpdating files: 100% (10/10), done.\n",
    ]:
        parser.feed(chunk)

    assert reports == [
        ("cloning", 10),
        ("cloning", 50),  # the half line, once whole
        ("cloning", 85),
        ("cloning", 89),
        ("checkout", 30),
        ("checkout", 100),
    ]
    assert parser.text() == "warning: remote HEAD refers to nonexistent ref"


def test_a_steps_last_percent_counts_even_when_other_lines_follow_it_in_the_same_read():
    """git may print more in the same write after a step's 100% (seen as a flaky real clone
    that ended its cloning phase at 82)."""
    reports: list[tuple[str, int | None]] = []
    parser = CloneProgress(lambda phase, percent: reports.append((phase, percent)))

    parser.feed(b"Receiving objects:  90% (9/10)\r")
    parser.feed(b"Receiving objects: 100% (10/10), done.\nremote: Total 10 (delta 0)\n")
    parser.feed(b"Resolving deltas: 100% (3/3), done.\nUpdating files:  50% (5/10)\r")

    assert reports == [("cloning", 78), ("cloning", 85), ("cloning", 97), ("checkout", 50)]
