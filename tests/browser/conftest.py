"""Fixtures for the real-browser tests: the built site, a local HTTP server, headless Chromium.

The tests need ``_build/html`` (``bash scripts/build-book.sh``) and Debian's ``chromium``.
When either is missing they are skipped with a message, unless SERVEBOOK_REQUIRE_BROWSER=1
(scripts/test.sh sets it), in which case they fail: CI must never skip them silently.
"""
from __future__ import annotations

import functools
import http.server
import os
import threading
from pathlib import Path

import pytest

from .cdp import Browser, find_chromium

ROOT = Path(__file__).resolve().parents[2]
SITE = ROOT / "_build" / "html"
ARTIFACTS = ROOT / "test-artifacts" / "browser"


def _missing(reason: str):
    if os.environ.get("SERVEBOOK_REQUIRE_BROWSER") == "1":
        pytest.fail(reason + " (SERVEBOOK_REQUIRE_BROWSER=1, so this is a failure, not a skip)", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def site_dir() -> Path:
    """The built book (_build/html)."""
    if not (SITE / "index.html").is_file():
        _missing(f"{SITE}/index.html not found: build the book first with `bash scripts/build-book.sh`")
    return SITE


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    # As scripts/book.sh serves them (the Run-live calculators' Pyodide files), whatever /etc/mime.types says.
    extensions_map = {**http.server.SimpleHTTPRequestHandler.extensions_map,
                      ".wasm": "application/wasm", ".mjs": "text/javascript"}

    def log_message(self, format, *args):  # noqa: A002 - signature fixed by the base class
        pass


@pytest.fixture(scope="session")
def site_url(site_dir: Path):
    """Base URL of the built book served on 127.0.0.1 (an ephemeral port)."""
    handler = functools.partial(_QuietHandler, directory=str(site_dir))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="session")
def browser():
    """Headless Chromium with a fresh profile in a temporary folder."""
    binary = find_chromium()
    if binary is None:
        _missing("chromium not found: install it with `apt-get update && apt-get install -y chromium` "
                 "(scripts/test.sh does this) or set CHROMIUM=/path/to/chromium")
    chromium = Browser(binary)
    try:
        chromium.send("Browser.getVersion", timeout_s=60)
    except Exception as exc:  # noqa: BLE001 - report Chromium's own words
        stderr = chromium.stderr_tail()
        chromium.close()
        pytest.fail(f"chromium did not start: {exc}\n{stderr}", pytrace=False)
    yield chromium
    chromium.close()


@pytest.fixture(scope="session")
def artifacts_dir() -> Path:
    """test-artifacts/browser/ (git-ignored): screenshots of every page."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS
