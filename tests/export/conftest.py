"""Fixtures of the browser tests (test_web*.py): the session's own cache of the web runtime, and a Playwright
driver per module."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.chromium import chromium_path


@pytest.fixture(scope="session")
def web_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A cache folder of the session's own, so the tests fetch the lock file's packages themselves (once)."""
    cache = tmp_path_factory.mktemp("xdg-cache")
    old = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(cache)
    yield cache
    if old is None:
        os.environ.pop("XDG_CACHE_HOME", None)
    else:
        os.environ["XDG_CACHE_HOME"] = old


@pytest.fixture(scope="module")
def playwright() -> Iterator[Any]:
    """One Playwright driver for the module (its sync API cannot be entered twice)."""
    if chromium_path() is None:
        pytest.skip("no Chromium: `apt-get install chromium` (Debian), or set GPTPORT_CHROMIUM")
    from playwright import sync_api  # a dev dependency: its absence is a failure, not a skip

    with sync_api.sync_playwright() as p:
        yield p
