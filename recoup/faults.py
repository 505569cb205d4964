"""Crash points for the crash-safety tests.

With RECOUP_CRASH_AT="<step>:<marker path>" in its environment, a process SIGKILLs itself the
first time it reaches <step>; the marker file records that it did, so a redelivered task runs
through. Unset (always, outside those tests) a crash point costs one environment lookup.
"""

import os
import signal


def crash_point(step: str) -> None:
    spec = os.environ.get("RECOUP_CRASH_AT")
    if not spec:
        return
    name, _, marker = spec.partition(":")
    if name != step or not marker:
        return
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return
    os.kill(os.getpid(), signal.SIGKILL)
