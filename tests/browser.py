"""Headless Chromium for the browser tests: the Debian ``chromium`` package driven by Playwright.

Playwright's own browser download needs the internet, so the tests drive the system
browser (``ATROPOS_CHROMIUM``, default ``/usr/bin/chromium``). Screenshots are kept under
``ATROPOS_TEST_ARTIFACTS`` (default ``.cache/test-artifacts``) for people to look at.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import pytest

CHROMIUM = Path(os.environ.get("ATROPOS_CHROMIUM", "/usr/bin/chromium"))
ARTIFACTS = Path(os.environ.get("ATROPOS_TEST_ARTIFACTS", Path(__file__).resolve().parent.parent / ".cache" / "test-artifacts"))


@pytest.fixture(scope="module")
def browser() -> Iterator["object"]:
    """A headless Chromium (`playwright.sync_api.Browser`) shared by a module's tests.

    Registered once, in tests/conftest.py: a fixture imported into several modules would be
    several fixtures, and a second Playwright started beside a live one fails. Module scope
    ends each Playwright before the next module's tests (some run asyncio loops) start."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is in the dev extra")
    if not CHROMIUM.exists():
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install -y chromium)")
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=["--no-sandbox", "--disable-gpu"]
        )
        try:
            yield chromium
        finally:
            chromium.close()


def artifact_path(name: str) -> Path:
    """Where a test saves `name` (a screenshot) for people to look at after the run."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS / name
