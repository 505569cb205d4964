import pytest


@pytest.fixture
def fast_sweep(settings):
    """Let the sweep re-dispatch a session one second after the last dispatch."""
    settings.LIFECYCLE_DISPATCH_GRACE = 1
    return settings
