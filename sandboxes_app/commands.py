"""Detached commands: start one (POST /api/sandbox/commands with `detached`), read it, follow
its log, kill it, and settle a sandbox's commands before its directory goes.

While a command runs, its supervisor on the host is the truth (providers.local_supervisor): it
writes the log and, at the end, the exit record. The `Command` row takes the exit over when
somebody looks (a read, a log stream, a kill, or the settle before hibernation or a one-shot's
destroy), by a compare-and-set on `finished_at`. A supervisor that went away without an exit
record (killed, a host restart, its sandbox deleted under it) is recorded as killed, with
`exitCode` null, after whatever is left of its command is killed too.
"""

import logging
import time
from collections.abc import Iterator

from django.conf import settings
from django.utils import timezone

from recoup import bus
from recoup.accounts.models import Account
from recoup.db import release_db_connection
from recoup.errors import Conflict, NotFound, UpstreamError
from recoup.streams import SHUTDOWN_CHECK_SECONDS, stream_deadline, stream_over
from sandboxes_app.git.commands import public_text
from sandboxes_app.models import COMMAND_ID, Command, Sandbox
from sandboxes_app.oneshots import oneshot_require_running
from sandboxes_app.providers.base import (
    DetachedExit,
    DetachedHooks,
    LogRecord,
    ProviderError,
    SandboxProvider,
    get_provider,
)
from sandboxes_app.quotas import command_slot_release, command_slot_take
from sandboxes_app.services import _require_active, session_activity_touch
from sessions_app.models import Session

logger = logging.getLogger("recoup.sandboxes")

# How long a kill waits for the command's exit to be recorded before it answers anyway.
KILL_WAIT_SECONDS = 2.0
# How long the settle before a sandbox's directory goes waits for supervisors to record.
SETTLE_WAIT_SECONDS = 2.0
_POLL_SECONDS = 0.25


def command_channel(command_id: str) -> str:
    """The bus channel the command's supervisor wakes its log's readers on."""
    return f"command:{command_id}"


def command_start(
    *,
    session: Session | None,
    sandbox: Sandbox | None,
    argv: list[str],
    cwd: str | None,
    env: dict[str, str] | None,
    timeout_s: float | None,
) -> Command:
    """Start a detached command in the session's active sandbox, or in the one-shot `sandbox`,
    and return it as soon as it runs. The same checks as a command that is waited for, in the
    same order (409 without a running sandbox, 429 when the account runs its quota of
    commands); it holds its command slot until it ends and counts as activity when it starts.
    Without `timeout_s` it may run SANDBOX_COMMAND_MAX_TIMEOUT seconds."""
    if session is not None:
        _require_active(session)
        account_id, organization_id = session.account_id, session.organization_id
    else:
        oneshot_require_running(sandbox)
        account_id, organization_id = sandbox.account_id, None
    if timeout_s is None:
        timeout_s = float(settings.SANDBOX_COMMAND_MAX_TIMEOUT)
    slot = command_slot_take(
        account_id=account_id, organization_id=organization_id, timeout_s=timeout_s
    )
    try:
        if session is not None:
            session = session_activity_touch(session=session)
            sandbox = Sandbox.objects.filter(session=session, destroyed_at__isnull=True).first()
            if sandbox is None:
                raise Conflict("Session has no active sandbox")
        command = Command.objects.create(
            account_id=account_id,
            session=session,
            sandbox=sandbox,
            cmd=argv[0],
            args=argv[1:],
            timeout_ms=int(timeout_s * 1000),
            quota_slot=slot,
            started_at=timezone.now(),
        )
        try:
            get_provider().start_detached(
                name=sandbox.name,
                command_id=command.id,
                argv=argv,
                cwd=cwd,
                env=env,
                timeout_s=timeout_s,
                hooks=DetachedHooks(
                    channel=command_channel(command.id),
                    redis_url=settings.REDIS_URL,
                    data_dir=str(settings.DATA_DIR),
                    account_id=str(account_id),
                    lease_slot=slot,
                ),
            )
        except BaseException:
            Command.objects.filter(id=command.id).delete()  # it never ran
            raise
    except BaseException as exc:
        command_slot_release(account_id=str(account_id), slot=slot)
        if not isinstance(exc, ProviderError):
            raise
        if session is None:
            # Destroyed while we were starting it: say so, not "the provider failed".
            sandbox.refresh_from_db()
            oneshot_require_running(sandbox)
        raise UpstreamError(f"The sandbox provider failed: {public_text(str(exc))}") from exc
    logger.info("detached command %s started sandbox=%s", command.id, sandbox.name)
    return command


def command_get_owned(
    *, command_id: str, account: Account, session_id: str | None, sandbox_id: str | None
) -> Command:
    """The account's command `command_id` of that session (or that one-shot sandbox); 404
    alike for another account's command, another session's, a malformed id and one that
    never existed, so an id's existence never leaks."""
    found = None
    scope = session_id if session_id is not None else sandbox_id
    # PostgreSQL refuses a NUL in a query; no id holds one.
    if COMMAND_ID.fullmatch(command_id) and scope is not None and "\x00" not in scope:
        commands = Command.objects.select_related("sandbox").filter(id=command_id, account=account)
        if session_id is not None:
            commands = commands.filter(session_id=session_id)
        else:
            commands = commands.filter(session__isnull=True, sandbox__name=sandbox_id)
        found = commands.first()
    if found is None:
        raise NotFound(f"Command {command_id[:64]} not found")
    return found


def command_refresh(*, command: Command, provider: SandboxProvider | None = None) -> Command:
    """The command, with its exit recorded once it has ended."""
    if command.finished_at is not None:
        return command
    provider = provider or get_provider()
    status = provider.detached_status(name=command.sandbox.name, command_id=command.id)
    if status.running:
        return command
    return _record_exit(command, done=status.exit, provider=provider)


def _record_exit(command: Command, *, done: DetachedExit | None, provider: SandboxProvider):
    if done is None:
        # Gone without a record: nothing of it may keep running once it is recorded killed.
        provider.detached_kill(name=command.sandbox.name, command_id=command.id)
        changes = {"finished_at": timezone.now(), "killed": True}
    else:
        changes = {
            "finished_at": done.finished_at,
            "exit_code": done.exit_code,
            "timed_out": done.timed_out,
            "killed": done.killed,
        }
    recorded = Command.objects.filter(id=command.id, finished_at__isnull=True).update(**changes)
    if recorded:
        logger.info(
            "detached command %s ended exit_code=%s timed_out=%s killed=%s%s",
            command.id,
            changes.get("exit_code"),
            changes.get("timed_out", False),
            changes["killed"],
            "" if done is not None else " (its supervisor left no record)",
        )
    if recorded and command.quota_slot:
        # Its supervisor frees the slot itself; not if it died first.
        command_slot_release(account_id=str(command.account_id), slot=command.quota_slot)
    command.refresh_from_db()
    return command


def command_kill(*, command: Command) -> Command:
    """Kill the command's whole process tree; the command once its exit is recorded, or as it
    is after KILL_WAIT_SECONDS (`finished_at` still null: the kill goes on)."""
    provider = get_provider()
    command = command_refresh(command=command, provider=provider)
    if command.finished_at is not None:
        return command
    release_db_connection()
    # Subscribed before the kill, so the supervisor's wake-up at exit cannot be missed.
    with bus.subscribe(command_channel(command.id)) as wakeups:
        provider.detached_kill(name=command.sandbox.name, command_id=command.id)
        deadline = time.monotonic() + KILL_WAIT_SECONDS
        while True:
            command = command_refresh(command=command, provider=provider)
            remaining = deadline - time.monotonic()
            if command.finished_at is not None or remaining <= 0:
                return command
            release_db_connection()
            wakeups.get(timeout=min(remaining, _POLL_SECONDS))


def command_log_offset_valid(*, command: Command, offset: int) -> bool:
    """True when the log can be read from `offset`: where one of its records ends, or 0."""
    return get_provider().detached_log_offset_valid(
        name=command.sandbox.name, command_id=command.id, offset=offset
    )


def command_log_follow(
    *, command: Command, offset: int
) -> Iterator[list[LogRecord] | Command | None]:
    """The command's log from `offset` as it is written: its records (in batches, as they are
    read), None whenever STREAM_KEEPALIVE_SECONDS pass without any, and last the command with
    its exit recorded.
    Past STREAM_MAX_SECONDS it stops without the command (the reader resumes from the last
    record's `end`).

    Subscribed first, then reading the log, then waiting for a wake-up: a wake-up that is lost
    costs latency, never a record. The exit is read before the log's end, and the supervisor
    writes the whole log before its exit, so the last read has everything."""
    provider = get_provider()
    name = command.sandbox.name
    deadline = stream_deadline()
    with bus.subscribe(command_channel(command.id)) as wakeups:
        while True:
            command = command_refresh(command=command, provider=provider)
            release_db_connection()
            while records := provider.detached_log(name=name, command_id=command.id, offset=offset):
                yield records
                offset = records[-1].end
            if command.finished_at is not None:
                yield command
                return
            # Until a wake-up or the keep-alive; checking every SHUTDOWN_CHECK_SECONDS whether
            # the stream must end (its deadline, or this web process stopping).
            keepalive = time.monotonic() + settings.STREAM_KEEPALIVE_SECONDS
            while True:
                if stream_over(deadline):
                    return
                now = time.monotonic()
                if now >= keepalive:
                    yield None
                    break
                wait = min(keepalive, deadline, now + SHUTDOWN_CHECK_SECONDS) - now
                if wakeups.get(timeout=max(wait, 0.0)) is not None:
                    break


def commands_settle(*, sandbox_name: str) -> int:
    """Record the exits of the sandbox's unfinished commands while its runs directory still
    holds their records: between stopping the sandbox (which ends its commands) and deleting
    its directory. Their supervisors record them within moments (waited for up to
    SETTLE_WAIT_SECONDS); one without a record is recorded killed. Returns how many were
    recorded."""
    pending = list(
        Command.objects.select_related("sandbox").filter(
            sandbox__name=sandbox_name, finished_at__isnull=True
        )
    )
    if not pending:
        return 0
    provider = get_provider()
    deadline = time.monotonic() + SETTLE_WAIT_SECONDS
    settled = 0
    for command in pending:
        while (
            time.monotonic() < deadline
            and provider.detached_status(name=sandbox_name, command_id=command.id).running
        ):
            time.sleep(0.02)
        if command_refresh(command=command, provider=provider).finished_at is not None:
            settled += 1
    return settled
