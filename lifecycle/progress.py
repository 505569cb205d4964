"""Provisioning progress: what a provider's `progress` calls become.

The provider reports phases (cloning with git's percent, checkout, from_base, starting) from
the thread that provisions; each report that passes the throttle is one narrow UPDATE of the
session's two progress columns, fenced by the run's lease (a run that lost the session reports
nothing more), then one bus message. The transition into provisioning or restoring stores
`queued`; the one that leaves clears the columns, and one into `active` publishes that phase.
"""

import logging
import time

from django.db import DatabaseError

from lifecycle.events import progress_publish
from recoup.db import release_db_connection
from sessions_app.models import Session

logger = logging.getLogger("recoup.lifecycle")

# At most one report per phase change, per 5 percent, or per 250 ms: a clone of a big
# repository makes git print hundreds of percentages.
MIN_PERCENT_STEP = 5
MIN_INTERVAL_SECONDS = 0.25


class ProvisioningProgress:
    """The `progress` callback of one provisioning or resume run. Never raises: progress is a
    courtesy to clients, and a failed report must not fail the run."""

    def __init__(self, *, session_id: str, run_id: str, version: int) -> None:
        self.session_id = session_id
        self.run_id = run_id
        self.version = version  # the run's claim; lets a reader notice a missed transition
        self._phase: str | None = None
        self._percent: int | None = None
        self._reported_at = 0.0
        self._lost = False

    def __call__(self, phase: str, percent: int | None = None) -> None:
        if self._lost or not self._due(phase, percent):
            return
        self._phase, self._percent, self._reported_at = phase, percent, time.monotonic()
        try:
            stored = Session.objects.filter(
                id=self.session_id, lifecycle_run_id=self.run_id
            ).update(provisioning_phase=phase, provisioning_percent=percent)
        except DatabaseError:
            logger.warning("progress not stored session=%s", self.session_id, exc_info=True)
            stored = 1  # the run goes on; its clients may still hear it
        finally:
            release_db_connection()  # the run waits on git or the provider again next
        if not stored:
            self._lost = True  # the lease went to another run, which reports for itself
            return
        progress_publish(
            session_id=self.session_id, phase=phase, percent=percent, version=self.version
        )

    def _due(self, phase: str, percent: int | None) -> bool:
        if phase != self._phase:
            return True
        if percent == self._percent:
            return False
        if percent is None or self._percent is None or percent == 100:
            return True
        return (
            abs(percent - self._percent) >= MIN_PERCENT_STEP
            or time.monotonic() - self._reported_at >= MIN_INTERVAL_SECONDS
        )
