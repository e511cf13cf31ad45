"""How fast the book's "Run live" calculators are in headless Chromium (goal: ready in under 10 s on a
2-core machine, each recompute under 100 ms; the tune calculator's recompute is a whole search, which the
page runs on a smaller grid than the CLI's: its goal is 5 s).

Serves the built book (``_build/html``; ``bash scripts/build-book.sh`` first) on 127.0.0.1, opens a page
with a live calculator in a new Chromium with an empty profile (a first visit), clicks "Run live" and
times it until the controls are live (Pyodide's runtime and standard library, the servebook wheel,
the first computation). Then it moves one control ``--moves`` times and times each recompute as the
page measures it (Python call and rendering, ``performance.now()``). Not a test: timings depend on
the machine. Prints one line per cold start and a summary with the ratio to each goal (< 1.0 meets it).

Run: ``PYTHONPATH=src .venv/bin/python benchmarks/bench_live.py [--runs 3] [--moves 30] [--page ...]``
"""
from __future__ import annotations

import argparse
import functools
import http.server
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.browser.cdp import Browser, find_chromium  # noqa: E402  (the browser tests' launcher and flags)
from tests.browser.conftest import _QuietHandler  # noqa: E402  (serves .wasm/.mjs as scripts/book.sh does)

READY_GOAL_S = 10.0
#: Recompute goal by the event a move fires: per keystroke, or per committed value (a whole search).
RECOMPUTE_GOAL_MS = {"input": 100.0, "change": 5000.0}
#: Page -> (the calculator timed, the control to move, the values it cycles through, the event a move
#: fires). The tune calculator (6.11) runs a whole search per move and recomputes on ``change`` (a
#: committed value), not per keystroke: time it with a few moves (``--moves 4``).
PAGES = {
    "notebooks/memory_budget.html": ("plan", "max_model_len", [4096, 8192, 16384, 32768, 65536], "input"),
    "notebooks/kv_per_token.html": ("kv", "context_tokens", [1024, 8192, 32768, 131072], "input"),
    "book/06-11-chunked-prefill.html": ("tune", "tpot_ms", [50, 25, 40, 35], "change"),
}


def _serve(site: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(site)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


def _cold_start(browser: Browser, url: str, calculator: str, control: str, values: list[int], event: str,
                moves: int) -> tuple[float, float, list[float]]:
    """(wall seconds click -> live, the page's own ready time in s, recompute times in ms)."""
    context, target, session = browser.new_page()
    try:
        for domain in ("Page", "Runtime"):
            browser.send(f"{domain}.enable", session=session)
        start = len(browser.events[session])
        browser.send("Page.navigate", {"url": url}, session)
        browser.wait_for_event(session, "Page.loadEventFired", 60, start)
        box = f".servebook-live[data-calculator={calculator}]"
        t0 = time.monotonic()
        browser.evaluate(session, f"document.querySelector('{box} button.servebook-live-run').click()")
        state = "loading"
        while state in ("idle", "loading") and time.monotonic() - t0 < 300:
            time.sleep(0.05)
            state = browser.evaluate(session, f"document.querySelector('{box}').dataset.state")
        wall = time.monotonic() - t0
        if state != "ready":
            status = browser.evaluate(session, f"document.querySelector('{box} .servebook-live-status').textContent")
            raise SystemExit(f"Run live ended in state {state!r}: {status}")
        ready = browser.evaluate(session, "window.servebookLive.timings.ready_ms") / 1000
        recompute = []
        done_js = f"Number(document.querySelector('{box}').dataset.computations || 0)"
        for i in range(moves):
            value = values[i % len(values)]
            before = browser.evaluate(session, done_js)
            browser.evaluate(session, f"""(() => {{
              const f = document.querySelector('{box} [name={control}]');
              f.value = '{value}'; f.dispatchEvent(new Event('{event}', {{bubbles: true}})); }})()""")
            # an input recomputes at once; a change (the tune search) after the page has painted its status
            while browser.evaluate(session, done_js) <= before and time.monotonic() - t0 < 600:
                time.sleep(0.02)
            recompute.append(browser.evaluate(session, "window.servebookLive.timings.last_compute_ms"))
        return wall, ready, recompute
    finally:
        browser.close_page(context, target)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--site", type=Path, default=ROOT / "_build" / "html")
    parser.add_argument("--page", choices=sorted(PAGES), action="append")
    parser.add_argument("--runs", type=int, default=3, help="cold starts per page (default 3)")
    parser.add_argument("--moves", type=int, default=30, help="control moves per cold start (default 30)")
    args = parser.parse_args()
    if not (args.site / "_vendor" / "live" / "manifest.json").is_file():
        raise SystemExit(f"{args.site} has no Run-live files (_vendor/live/manifest.json): build the book first "
                         "with `bash scripts/build-book.sh`")
    binary = find_chromium()
    if binary is None:
        raise SystemExit("chromium not found: apt-get install -y chromium, or set CHROMIUM=/path/to/chromium")
    server, base = _serve(args.site)
    print(f"machine: {os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.2f}; {binary}")
    try:
        for page in args.page or sorted(PAGES):
            calculator, control, values, event = PAGES[page]
            walls, readies, recomputes = [], [], []
            for run in range(args.runs):
                # A new Chromium with a new profile each time: no HTTP cache, no compiled-WebAssembly cache.
                browser = Browser(binary)
                try:
                    browser.send("Browser.getVersion", timeout_s=60)
                    wall, ready, recompute = _cold_start(browser, base + page, calculator, control, values, event,
                                                        args.moves)
                finally:
                    browser.close()
                walls.append(wall)
                readies.append(ready)
                recomputes += recompute
                print(f"{page} cold start {run + 1}: ready {wall:.2f} s after the click (page: {ready:.2f} s); "
                      f"recompute median {statistics.median(recompute):.1f} ms, max {max(recompute):.1f} ms")
            print(json.dumps({
                "page": page, "runs": args.runs, "moves": len(recomputes),
                "ready_s_median": round(statistics.median(walls), 2), "ready_s_max": round(max(walls), 2),
                "ready_vs_goal": round(statistics.median(walls) / READY_GOAL_S, 2),
                "recompute_ms_median": round(statistics.median(recomputes), 1),
                "recompute_ms_p95": round(sorted(recomputes)[int(0.95 * (len(recomputes) - 1))], 1),
                "recompute_vs_goal": round(statistics.median(recomputes) / RECOMPUTE_GOAL_MS[event], 2),
            }))
    finally:
        server.shutdown()


if __name__ == "__main__":
    main()
