"""Shared pytest setup.

Every test carries exactly one of the markers sim / gpu / hw.  Tests without
one get `sim`; a test with more than one is an error.  CI runs `-m sim`.
"""
import pytest

from native_util import cleanup_fabric, new_fabric

HARDWARE_MARKERS = ("sim", "gpu", "hw")


def pytest_collection_modifyitems(config, items):
    for item in items:
        own = [m for m in HARDWARE_MARKERS if item.get_closest_marker(m) is not None]
        if len(own) > 1:
            raise pytest.UsageError(f"{item.nodeid} carries several of {HARDWARE_MARKERS}: {own}")
        if not own:
            item.add_marker(pytest.mark.sim)


@pytest.fixture
def fabric():
    """A fresh emulated fabric (tests/native_util.py); its shared memory is removed afterwards."""
    name = new_fabric()
    yield name
    cleanup_fabric(name)
