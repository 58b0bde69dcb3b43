"""Shared pytest setup.

Every test carries exactly one of the markers sim / gpu / hw.  Tests without
one get `sim`; a test with more than one is an error.  CI runs `-m sim`.
"""
import pytest

HARDWARE_MARKERS = ("sim", "gpu", "hw")


def pytest_collection_modifyitems(config, items):
    for item in items:
        own = [m for m in HARDWARE_MARKERS if item.get_closest_marker(m) is not None]
        if len(own) > 1:
            raise pytest.UsageError(f"{item.nodeid} carries several of {HARDWARE_MARKERS}: {own}")
        if not own:
            item.add_marker(pytest.mark.sim)
