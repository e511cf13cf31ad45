"""Every built page, loaded in headless Chromium from 127.0.0.1, works offline.

For each HTML page of _build/html the browser records every request (each one is intercepted:
a request for any host but 127.0.0.1 is refused and fails the test), uncaught JavaScript errors,
console errors, failed or 4xx/5xx local requests and broken images. Pages with math must show
MathJax output; pages with saved widget state must render every widget. A screenshot of each page
is kept under test-artifacts/browser/.
"""
from __future__ import annotations

import base64
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from .cdp import Browser
from .conftest import SITE

pytestmark = pytest.mark.browser

LOCAL_HOST = "127.0.0.1"
WIDGET_PAGE = "notebooks/kv_per_token.html"


def built_pages() -> list[str]:
    """Every HTML page of the built book, relative to _build/html (assets folders excluded)."""
    if not SITE.is_dir():
        return []
    skip = ("_static/", "_vendor/", "_sources/", "_images/", "_downloads/")
    return sorted(p.relative_to(SITE).as_posix() for p in SITE.rglob("*.html")
                  if not p.relative_to(SITE).as_posix().startswith(skip))


@dataclass
class PageReport:
    """What one page load did."""

    url: str
    requests: list[str] = field(default_factory=list)
    blocked: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    exceptions: list[str] = field(default_factory=list)
    console_errors: list[str] = field(default_factory=list)
    checks: dict = field(default_factory=dict)


def _is_local(url: str) -> bool:
    parts = urlsplit(url)
    if parts.scheme in ("data", "blob", "about"):
        return True
    return parts.scheme in ("http", "https", "ws", "wss") and parts.hostname == LOCAL_HOST


# Evaluated in the page once it has loaded: what a reader would see.
PAGE_CHECKS_JS = r"""
(async () => {
  const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
  const mathNodes = document.querySelectorAll('.math, span.math, div.math');
  if (mathNodes.length && window.MathJax && MathJax.startup && MathJax.startup.promise) {
    await MathJax.startup.promise;
  }
  const viewScripts = document.querySelectorAll('script[type="application/vnd.jupyter.widget-view+json"]');
  let rendered = 0;
  for (let i = 0; i < 100 && viewScripts.length; i++) {
    rendered = Array.from(viewScripts).filter(
      (s) => s.previousElementSibling && s.previousElementSibling.classList.contains('widget-subarea')
             && s.previousElementSibling.querySelector('.jupyter-widgets, .widget-box, .widget-inline-hbox')).length;
    if (rendered === viewScripts.length) break;
    await sleep(100);
  }
  const images = Array.from(document.images);
  return {
    math_nodes: mathNodes.length,
    mathjax_output: document.querySelectorAll('mjx-container').length,
    widget_views: viewScripts.length,
    widgets_rendered: rendered,
    dropdowns: document.querySelectorAll('.widget-dropdown select').length,
    sliders: document.querySelectorAll('.widget-slider, .jupyter-widget-slider').length,
    widget_text: Array.from(document.querySelectorAll('.widget-html-content')).map((e) => e.innerText).join(' | '),
    images: images.length,
    broken_images: images.filter((i) => !(i.complete && i.naturalWidth > 0)).map((i) => i.src),
    title: document.title,
  };
})()
"""


@contextmanager
def watched_page(browser: Browser, url: str, settle_s: float = 0.5, timeout_s: float = 60.0):
    """Load ``url`` in a fresh tab and wait until it is quiet; yields (session, report).

    Until the block ends, every request is recorded (any host but 127.0.0.1 is refused and listed
    in ``report.blocked``), with failed requests, uncaught exceptions and console errors.
    """
    report = PageReport(url)
    context, target, session = browser.new_page()
    in_flight: set[str] = set()
    last_activity = [time.monotonic()]

    def on_event(event: dict) -> None:
        if event.get("sessionId") != session:
            return
        method, params = event["method"], event.get("params", {})
        if method == "Fetch.requestPaused":
            request_url = params["request"]["url"]
            if _is_local(request_url):
                browser.send_nowait("Fetch.continueRequest", {"requestId": params["requestId"]}, session)
            else:
                report.blocked.append(request_url)
                browser.send_nowait("Fetch.failRequest", {"requestId": params["requestId"],
                                                          "errorReason": "BlockedByClient"}, session)
        elif method == "Network.requestWillBeSent":
            report.requests.append(params["request"]["url"])
            if not _is_local(params["request"]["url"]) and params["request"]["url"] not in report.blocked:
                report.blocked.append(params["request"]["url"])
            # The tab's icon is fetched by the browser itself, which never reports that load as
            # finished: waiting for it would run out the timeout (its status is still checked).
            if not params["request"]["url"].split("?")[0].endswith(("/favicon.svg", "/favicon.ico")):
                in_flight.add(params["requestId"])
            last_activity[0] = time.monotonic()
        elif method == "Network.responseReceived":
            status = params["response"]["status"]
            if status >= 400:
                report.failed.append(f"{status} {params['response']['url']}")
        elif method in ("Network.loadingFinished", "Network.loadingFailed"):
            in_flight.discard(params["requestId"])
            last_activity[0] = time.monotonic()
            if method == "Network.loadingFailed" and not params.get("canceled"):
                report.failed.append(f"{params.get('errorText')} (request {params['requestId']})")
        elif method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details.get("text")
            report.exceptions.append(f"{text} at {details.get('url', '?')}:{details.get('lineNumber')}")
        elif method == "Runtime.consoleAPICalled" and params["type"] == "error":
            report.console_errors.append(" ".join(str(a.get("value", a.get("description", "")))
                                                  for a in params.get("args", [])))
        elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
            report.console_errors.append(f"{params['entry']['text']} {params['entry'].get('url', '')}")

    browser.handlers.append(on_event)
    try:
        for domain in ("Page", "Runtime", "Network", "Log"):
            browser.send(f"{domain}.enable", session=session)
        browser.send("Fetch.enable", {"patterns": [{"urlPattern": "*"}]}, session)
        browser.send("Emulation.setDeviceMetricsOverride",
                     {"width": 1280, "height": 900, "deviceScaleFactor": 1, "mobile": False}, session)
        start = len(browser.events[session])
        browser.send("Page.navigate", {"url": url}, session)
        browser.wait_for_event(session, "Page.loadEventFired", timeout_s, start)
        deadline = time.monotonic() + timeout_s
        while (in_flight or time.monotonic() - last_activity[0] < settle_s) and time.monotonic() < deadline:
            time.sleep(0.1)
        yield session, report
    finally:
        browser.handlers.remove(on_event)
        browser.close_page(context, target)


def screenshot_page(browser: Browser, session: str, screenshot: Path, timeout_s: float = 60.0) -> None:
    """Full-page screenshot: grow the viewport to the page's height (capped), then capture it."""
    height = min(int(browser.evaluate(session, "Math.ceil(document.documentElement.scrollHeight)") or 900), 8000)
    browser.send("Emulation.setDeviceMetricsOverride",
                 {"width": 1280, "height": height, "deviceScaleFactor": 1, "mobile": False}, session)
    time.sleep(0.3)
    shot = browser.send("Page.captureScreenshot", {"format": "png"}, session, timeout_s)
    screenshot.parent.mkdir(parents=True, exist_ok=True)
    screenshot.write_bytes(base64.b64decode(shot["data"]))


def visit(browser: Browser, url: str, screenshot: Path, settle_s: float = 0.5,
          timeout_s: float = 60.0) -> PageReport:
    """Load ``url`` in a fresh tab, wait until it is quiet, run the page checks, take a screenshot."""
    with watched_page(browser, url, settle_s, timeout_s) as (session, report):
        report.checks = browser.evaluate(session, PAGE_CHECKS_JS, timeout_s)
        screenshot_page(browser, session, screenshot, timeout_s)
    return report


PAGES = built_pages()


def test_the_book_has_pages(site_dir):
    """The build produced the landing page and the widget notebook (else nothing below ran)."""
    pages = built_pages()
    assert "index.html" in pages
    assert WIDGET_PAGE in pages, f"{WIDGET_PAGE} missing from the build; pages: {pages}"


@pytest.mark.parametrize("page", PAGES or ["<no built book>"])
def test_page_works_offline(page, site_url, browser, artifacts_dir):
    if page == "<no built book>":
        pytest.fail("no HTML pages under _build/html: build the book first (bash scripts/build-book.sh)")
    shot = artifacts_dir / (page.replace("/", "__").removesuffix(".html") + ".png")
    report = visit(browser, site_url + page, shot)
    problems = []
    if report.blocked:
        problems.append(f"requests leaving {LOCAL_HOST} (blocked): {report.blocked}")
    if report.exceptions:
        problems.append(f"uncaught JavaScript errors: {report.exceptions}")
    if report.console_errors:
        problems.append(f"console errors: {report.console_errors}")
    if report.failed:
        problems.append(f"failed requests: {report.failed}")
    checks = report.checks
    if checks["broken_images"]:
        problems.append(f"images that did not load: {checks['broken_images']}")
    if checks["math_nodes"] and not checks["mathjax_output"]:
        problems.append(f"{checks['math_nodes']} math nodes but no MathJax output (raw LaTeX shown)")
    if checks["widget_views"] != checks["widgets_rendered"]:
        problems.append(f"{checks['widget_views']} saved widget views, {checks['widgets_rendered']} rendered")
    assert not problems, f"{page} (screenshot {shot}):\n  " + "\n  ".join(problems)


def test_widget_page_shows_the_calculator(site_url, browser, artifacts_dir):
    """The KV notebook's saved widgets render as a reader sees them: dropdown, slider, GiB answer."""
    shot = artifacts_dir / "kv_per_token-widget.png"
    report = visit(browser, site_url + WIDGET_PAGE, shot)
    checks = report.checks
    assert checks["widget_views"] >= 1, f"no saved widget view on {WIDGET_PAGE}; was widget state stored?"
    assert checks["widgets_rendered"] == checks["widget_views"], f"widgets not rendered; see {shot}"
    assert checks["dropdowns"] >= 1 and checks["sliders"] >= 1, f"no dropdown/slider visible; see {shot}"
    # 32 Ki tokens of Llama 3.1 8B at 128 KiB/token (2 x 32 x 8 x 128 x 2 bytes) is 4 GiB.
    assert "4.00 GiB" in checks["widget_text"], f"widget answer missing: {checks['widget_text']!r}; see {shot}"
    assert checks["images"] >= 1 and not checks["broken_images"], f"plot missing; see {shot}"
    assert checks["mathjax_output"] >= 1, f"math not rendered by MathJax; see {shot}"
