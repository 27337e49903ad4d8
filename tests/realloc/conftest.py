"""Shared fixtures of the reallocation tests."""

import pytest

from meshrl.runtime.launch import RankPool


@pytest.fixture(scope="module")
def pool():
    """Eight gloo ranks for one test module."""
    p = RankPool(8, timeout=300, start_timeout=300)
    try:
        yield p
    finally:
        p.close(force=True)  # the ranks are idle: no need to wait for a clean process-group shutdown
