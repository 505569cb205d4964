"""The console end to end, as a person uses it: Debian's chromium, driven by Playwright, against
`manage.py web` and a real Celery worker. Sign in, create a session, provision it and watch the
badge and progress, run a command and watch its output arrive, hibernate, resume.

The page follows the lifecycle event stream and streams detached commands' logs where the
server has them, and otherwise polls the status and runs commands the plain way; this test
passes either way, and checks the streamed behaviour where the server streams.
"""

import pytest
import requests
from django.core.management import call_command
from playwright.sync_api import Page, sync_playwright

from tests.recoup.test_web_entry import start_web

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
TITLE = "e2e <b>demo</b>"
PHASES = {"queued", "cloning", "checkout", "from_base", "starting", "active"}
# Prints a line, waits, prints markup (which must stay text), then writes stderr: a streamed
# output shows the first line well before the command ends.
COMMAND = (
    "echo kept > note.txt; echo first line; sleep 1.5; "
    "echo '<script>window.pwned=1</script><img src=x onerror=window.pwned=2>'; echo oops >&2"
)

# Records, as the page changes, every badge state and progress label shown, and when output
# and the exit line first appeared: what a person watching the page would have seen.
RECORDER = """() => {
  const seen = window.__seen = {badges: [], progress: [], progressShown: false, output: []};
  const note = () => {
    const badge = document.getElementById('badge').dataset.state;
    if (seen.badges[seen.badges.length - 1] !== badge) seen.badges.push(badge);
    const label = document.getElementById('progress-label').textContent;
    if (label && !seen.progress.includes(label)) seen.progress.push(label);
    if (!document.getElementById('progress').hidden) seen.progressShown = true;
    const out = document.getElementById('output').textContent;
    const exit = document.getElementById('exit').textContent;
    if (out.includes('first line') && !seen.firstLineAt) seen.firstLineAt = performance.now();
    if (exit && !seen.exitAt) seen.exitAt = performance.now();
  };
  new MutationObserver(note).observe(document.body,
    {subtree: true, childList: true, characterData: true, attributes: true});
  note();
}"""


def wait_badge(page: Page, state: str, timeout_s: float = 30) -> None:
    page.wait_for_function(
        "s => document.getElementById('badge').dataset.state === s",
        arg=state,
        timeout=timeout_s * 1000,
    )


def seen(page: Page) -> dict:
    return page.evaluate("() => window.__seen")


def streams_exist(base: str, key: str, session_id: str) -> bool:
    """Whether this server has the lifecycle event stream (the page degrades without it)."""
    with requests.get(
        f"{base}/api/sandbox/events",
        params={"sessionId": session_id},
        headers={"x-api-key": key},
        stream=True,
        timeout=10,
    ) as response:
        return response.status_code == 200


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_person_signs_in_provisions_runs_a_command_hibernates_and_resumes(
    owner, repo_url, worker, settings, tmp_path
):
    call_command("collectstatic", interactive=False, verbosity=0)  # what `manage.py up` does
    web, base = start_web(
        settings, CELERY_TASK_DEFAULT_QUEUE=worker.queue, WEB_WORKERS="1", WEB_THREADS="32"
    )
    problems: list[str] = []
    commands: list[int] = []
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
            )
            page = browser.new_page(viewport={"width": 1100, "height": 1000})
            page.set_default_timeout(30_000)
            page.on("pageerror", lambda error: problems.append(f"page error: {error}"))
            page.on(
                "console",
                lambda m: "Content Security Policy" in m.text and problems.append(m.text),
            )
            page.on(
                "response",
                lambda r: (
                    r.request.method == "POST"
                    and r.url.endswith("/api/sandbox/commands")
                    and commands.append(r.status)
                ),
            )

            # Sign in: the key goes in a form, never into a URL.
            page.goto(base + "/")
            page.fill("#id_api_key", owner.raw_key)
            page.click("button[type=submit]")
            page.wait_for_selector("text=New session")
            assert owner.raw_key not in page.url

            # A new session, whose title is markup that must show as text.
            page.fill("#id_repo_url", repo_url)
            page.fill("#id_title", TITLE)
            page.click("form[action='/sessions'] button[type=submit]")
            page.wait_for_url(base + "/sessions/*")
            session_id = page.url.rsplit("/", 1)[1]
            assert page.text_content("#title") == TITLE
            assert page.text_content("#badge") == "not started"
            streaming = streams_exist(base, owner.raw_key, session_id)

            # Provision: the badge moves through provisioning, with a progress bar, to ready.
            page.evaluate(RECORDER)
            page.click("#start")
            wait_badge(page, "active")
            assert page.text_content("#flow-message") == "Ready. Run a command below."
            provisioning = seen(page)
            assert provisioning["badges"][-2:] == ["provisioning", "active"], provisioning
            assert provisioning["progressShown"], provisioning
            shown_phases = {label.split(" ")[0] for label in provisioning["progress"]}
            assert shown_phases <= PHASES, provisioning
            if streaming:
                assert shown_phases, f"the event stream reported no progress: {provisioning}"

            # A command: its output appears, markup in it stays text.
            page.fill("#command", COMMAND)
            page.click("#run")
            page.wait_for_function(
                "() => document.getElementById('exit').textContent.startsWith('exit')"
            )
            assert page.text_content("#exit").startswith("exit 0")
            output = page.text_content("#output")
            assert "first line" in output and "oops" in output
            assert "<script>window.pwned=1</script><img src=x onerror=window.pwned=2>" in output
            assert page.locator("#output script, #output img").count() == 0
            assert page.evaluate("() => window.pwned") is None
            assert page.locator("#output .stderr").first.text_content() == "oops\n"
            ran = seen(page)
            if commands == [202]:  # detached: the logs were streamed as they came
                assert ran["exitAt"] - ran["firstLineAt"] > 1000, ran
            else:
                assert commands == [200], commands

            # Hibernate: the worker snapshots the workspace; the page offers to resume.
            page.click("#hibernate")
            wait_badge(page, "hibernated")
            assert page.is_visible("#resume") and page.is_disabled("#command")
            if streaming:  # polling every 2 s may miss a quick hibernation's middle step
                assert "hibernating" in seen(page)["badges"], seen(page)

            # Resume from the snapshot: the workspace is back as it was.
            page.click("#resume")
            wait_badge(page, "active")
            assert "restoring" in seen(page)["badges"], seen(page)
            page.fill("#command", "cat note.txt")
            page.click("#run")
            page.wait_for_function(
                "() => document.getElementById('exit').textContent.startsWith('exit')"
            )
            assert page.text_content("#output").endswith("kept\n")

            # The history, from the server, newest first: kept current while the page is open,
            # the same after a reload.
            page.wait_for_function(
                "() => document.querySelectorAll('#history tbody tr').length >= 6"
            )
            page.screenshot(path=str(tmp_path / "console-session.png"), full_page=True)
            print(f"console screenshot: {tmp_path / 'console-session.png'}")
            for reloaded in (False, True):
                if reloaded:
                    page.reload()
                states = page.locator("#history tbody tr td:nth-child(3)").all_text_contents()
                assert states == [
                    "active",
                    "restoring",
                    "hibernated",
                    "hibernating",
                    "active",
                    "provisioning",
                ], states
            assert page.locator("#history tbody tr td:nth-child(5)").last.text_content() == "you"
            browser.close()
    finally:
        web.terminate()
        web.wait(timeout=30)
    assert problems == []
