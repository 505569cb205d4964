"""git's progress on stderr (`git clone --progress`) as one monotonic percent per phase.

git redraws a line per percent ("Receiving objects:  45% (9/20)\\r"), and a clone runs several
such steps one after another. The transfer steps make up the `cloning` phase, each over its own
span of one percent that never goes back; "Updating files" is git's checkout, the `checkout`
phase with git's own percent. Only a change is reported: a clone that prints thousands of
lines costs a split and an anchored match per line.
"""

import re
from collections.abc import Callable

# Where each step of a clone falls in the `cloning` phase's percent: the server counts and
# compresses ("remote: ..."; a big repository can keep it busy for seconds), then git receives
# the pack, resolves its deltas and checks it.
_CLONE_SPANS = {
    b"Counting objects": (0, 5),
    b"Compressing objects": (5, 15),
    b"Receiving objects": (15, 85),
    b"Resolving deltas": (85, 97),
    b"Checking objects": (97, 100),
    b"Checking connectivity": (97, 100),
}
_LINE = re.compile(rb"^(?:remote: )?(?P<step>[A-Z][a-z]+ [a-z]+): +(?P<percent>\d{1,3})% ")
# Progress and chatter, not kept for an error message: "remote: Counting objects: ...",
# "Receiving objects: ...", "remote: Total 22 (delta 0) ...", "Cloning into 'x'...".
_NOISE = re.compile(rb"^(?:remote: )?(?:[A-Z][a-z]+ [a-z]+: |Total \d)|^Cloning into ")
_KEPT_BYTES = 16384

Report = Callable[[str, int | None], None]


class CloneProgress:
    """Feed it git's stderr as it comes; it calls `report(phase, percent)` on each change and
    keeps the lines that are not progress, for the error message if git fails."""

    def __init__(self, report: Report) -> None:
        self._report = report
        self._phase = "cloning"
        self._percent = 0
        self._partial = b""
        self._kept = bytearray()

    def feed(self, data: bytes) -> None:
        data = self._partial + data
        end = max(data.rfind(b"\r"), data.rfind(b"\n"))
        if end < 0:
            self._partial = data[-_KEPT_BYTES:]
            return
        complete, self._partial = data[:end], data[end + 1 :]
        lines = re.split(rb"[\r\n]", complete)
        for line in lines:
            if line and not _NOISE.match(line):
                self._kept += line + b"\n"
        if len(self._kept) > _KEPT_BYTES:
            del self._kept[:-_KEPT_BYTES]
        # Every line, not only the newest: git may print more after a step's last percent in the
        # same write ("remote: Total ...", the checkout's first line), and that percent counts.
        for line in lines:
            self._parse(line)

    def text(self) -> str:
        """What git said besides its progress (its errors, warnings and hints)."""
        tail = b"" if _NOISE.match(self._partial) else self._partial
        return (bytes(self._kept) + tail).decode(errors="replace").strip()

    def _parse(self, line: bytes) -> None:
        match = _LINE.match(line)
        if match is None:
            return
        step, percent = match["step"], min(100, int(match["percent"]))
        if step == b"Updating files":
            phase = "checkout"
        elif step in _CLONE_SPANS and self._phase == "cloning":
            low, high = _CLONE_SPANS[step]
            phase, percent = "cloning", low + (high - low) * percent // 100
        else:
            return
        if phase != self._phase:
            self._phase, self._percent = phase, -1
        if percent > self._percent:
            self._percent = percent
            self._report(phase, percent)
