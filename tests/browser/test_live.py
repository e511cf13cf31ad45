"""The "Run live" calculator in headless Chromium: the tested library in the page, offline.

On the built memory-budget notebook page the test clicks "Run live", waits for Pyodide and the
servebook wheel (both served by the book itself), changes controls, and checks each shown number
against this CPython's servebook for the same inputs. Bad input (a model that does not fit, a
malformed pasted config.json) must show the library's own message. Nothing may load before the
click, no request may leave 127.0.0.1, and the console must stay free of errors.
"""
from __future__ import annotations

import base64
import json
import re
import time

import pytest

from servebook import DoesNotFitError, make_plan
from servebook.errors import ConfigError
from servebook.hf_config import load_model_spec
from servebook.kv_cache import kv_cache_layout, min_kv_bytes_for_one_request
from servebook.live import PASTED
from servebook.shipped import MODELS_DIR

from .test_pages import LOCAL_HOST, watched_page

pytestmark = pytest.mark.browser

PAGE = "notebooks/memory_budget.html"
KV_PAGE = "notebooks/kv_per_token.html"
#: The control's starting values on that page (its live-calculator directive).
START = {"model": "gemma-4-26b-a4b", "gpu": "H200", "tp": 1, "max_model_len": 16384}
READY_TIMEOUT_S = 120   # cold start is ~7 s on 2 cores; a loaded CI machine gets room

STATE_JS = "document.querySelector('.servebook-live').dataset.state"
NUMBERS_JS = """JSON.stringify(Object.fromEntries(Array.from(
  document.querySelectorAll('.servebook-live td[data-key]')).map((td) => [td.dataset.key,
  {value: JSON.parse(td.dataset.value), text: td.textContent}])))"""
ERROR_JS = """JSON.stringify((() => { const e = document.querySelector('.servebook-live-error');
  return {hidden: e.hidden, text: e.textContent}; })())"""


def _set(browser, session, name: str, value) -> None:
    """Set a control as a reader does; the page recomputes synchronously on the event."""
    browser.evaluate(session, f"""(() => {{
      const f = document.querySelector('.servebook-live [name={name}]');
      if (!f) throw new Error('no control {name}');
      f.value = {json.dumps(str(value))};
      if (f.value !== {json.dumps(str(value))}) throw new Error('{name} has no option ' + {json.dumps(str(value))});
      f.dispatchEvent(new Event(f.tagName === 'SELECT' ? 'change' : 'input', {{bubbles: true}}));
    }})()""")


def _shown(browser, session) -> dict:
    return json.loads(browser.evaluate(session, NUMBERS_JS))


def _error(browser, session) -> str | None:
    error = json.loads(browser.evaluate(session, ERROR_JS))
    return None if error["hidden"] else error["text"]


def _assert_matches(shown: dict, plan) -> None:
    """The page's numbers are make_plan's for the same inputs (integers exactly, GiB to 1e-12)."""
    assert shown["kv_cache_tokens"]["value"] == plan.capacity.kv_cache_tokens
    assert shown["kv_cache_tokens"]["text"] == f"{plan.capacity.kv_cache_tokens:,}"
    assert shown["recommended_max_num_seqs"]["value"] == plan.recommended_max_num_seqs
    assert shown["kv_bytes_per_token"]["value"] == plan.capacity.layout.kv_bytes_per_token
    assert shown["max_concurrency"]["value"] == pytest.approx(plan.capacity.max_concurrency, rel=1e-12)
    assert shown["available_kv_gib"]["value"] == pytest.approx(plan.budget.available_kv_gib, rel=1e-12)
    assert shown["weights_gib"]["value"] == pytest.approx(plan.budget.weights_gib, rel=1e-12)


def _screenshot_control(browser, session, path, selector: str = ".servebook-live") -> None:
    """A screenshot of the live control alone (test-artifacts/browser/): the viewport grown to the
    page's height (as the page tests do), then clipped to the control."""
    height = min(int(browser.evaluate(session, "Math.ceil(document.documentElement.scrollHeight)") or 900), 8000)
    browser.send("Emulation.setDeviceMetricsOverride",
                 {"width": 1280, "height": height, "deviceScaleFactor": 1, "mobile": False}, session)
    time.sleep(0.3)
    rect = json.loads(browser.evaluate(session, """JSON.stringify((() => {
      const r = document.querySelector('""" + selector + """').getBoundingClientRect();
      return {x: r.left, y: r.top, width: r.width, height: r.height}; })())"""))
    shot = browser.send("Page.captureScreenshot", {"format": "png", "clip": {**rect, "scale": 1}}, session)
    path.write_bytes(base64.b64decode(shot["data"]))


def _wait_ready(browser, session) -> str:
    deadline = time.monotonic() + READY_TIMEOUT_S
    state = browser.evaluate(session, STATE_JS)
    while state in ("idle", "loading") and time.monotonic() < deadline:
        time.sleep(0.2)
        state = browser.evaluate(session, STATE_JS)
    return state


def test_run_live_shows_cpythons_numbers_offline(site_url, browser, artifacts_dir, tmp_path):
    with watched_page(browser, site_url + PAGE) as (session, report):
        assert browser.evaluate(session, STATE_JS) == "idle"
        assert not [u for u in report.requests if "/_vendor/pyodide/" in u or u.endswith(".whl")], \
            "Pyodide or the wheel loaded before the click"

        browser.evaluate(session, "document.querySelector('.servebook-live button.servebook-live-run').click()")
        state = _wait_ready(browser, session)
        status = browser.evaluate(session, "document.querySelector('.servebook-live-status').textContent")
        assert state == "ready", f"Run live ended in state {state!r}: {status}"

        # As the page starts: the directive's values, the rest at make_plan's defaults.
        _assert_matches(_shown(browser, session), make_plan(START["model"], gpu=START["gpu"], tp=START["tp"],
                                                            max_model_len=START["max_model_len"]))
        # A reader changes the context, the GPU, TP, the utilisation and the KV dtype.
        _set(browser, session, "max_model_len", 32768)
        _assert_matches(_shown(browser, session), make_plan(START["model"], gpu="H200", max_model_len=32768))
        _set(browser, session, "model", "llama-3.1-70b")
        _set(browser, session, "gpu", "H100-SXM-80GB")
        _set(browser, session, "tp", 4)
        _set(browser, session, "gpu_memory_utilization", 0.85)
        _set(browser, session, "kv_cache_dtype", "fp8")
        assert _error(browser, session) is None
        _assert_matches(_shown(browser, session), make_plan("llama-3.1-70b", gpu="H100", tp=4, max_model_len=32768,
                                                            gpu_memory_utilization=0.85, kv_cache_dtype="fp8"))

        # A model that does not fit: the library's own message, word for word.
        _set(browser, session, "tp", 1)
        with pytest.raises(DoesNotFitError) as not_fit:
            make_plan("llama-3.1-70b", gpu="H100", tp=1, max_model_len=32768,
                      gpu_memory_utilization=0.85, kv_cache_dtype="fp8")
        assert _error(browser, session) == str(not_fit.value)

        # A malformed pasted config.json: the message hf_config gives for such a file.
        _set(browser, session, "tp", 2)
        _set(browser, session, "model", "__paste__")
        assert _error(browser, session).startswith("the config.json box is empty; paste")
        malformed = tmp_path / "config.json"
        malformed.write_text('{"architectures": ["LlamaForCausalLM"], "hidden_size": 4096')
        with pytest.raises(ConfigError) as bad_config:
            make_plan(str(malformed), gpu="H100", tp=2, max_model_len=32768)
        _set(browser, session, "config_json", malformed.read_text())
        assert _error(browser, session) == str(bad_config.value).replace(str(malformed), PASTED)
        assert _error(browser, session).startswith(f"{PASTED} is not valid JSON")
        _screenshot_control(browser, session, artifacts_dir / "run-live-error.png")

        # ... and a valid one (the shipped Llama 3.1 8B config, pasted) computes again.
        _set(browser, session, "config_json", (MODELS_DIR / "llama-3.1-8b.json").read_text())
        assert _error(browser, session) is None
        _assert_matches(_shown(browser, session), make_plan(str(MODELS_DIR / "llama-3.1-8b.json"), gpu="H100", tp=2,
                                                            max_model_len=32768, gpu_memory_utilization=0.85,
                                                            kv_cache_dtype="fp8"))
        assert "<svg" in browser.evaluate(session, "document.querySelector('.servebook-live-chart').innerHTML")
        _screenshot_control(browser, session, artifacts_dir / "run-live.png")

    assert not report.blocked, f"requests leaving {LOCAL_HOST}: {report.blocked}"
    assert not report.exceptions, report.exceptions
    assert not report.console_errors, report.console_errors
    assert not report.failed, report.failed
    loaded = [u for u in report.requests if "/_vendor/pyodide/" in u or re.search(r"/servebook-[^/]+\.whl$", u)]
    assert any(u.endswith("pyodide.asm.wasm") for u in loaded) and any(u.endswith(".whl") for u in loaded), loaded



def test_the_kv_calculator_shows_the_layouts_bytes(site_url, browser):
    with watched_page(browser, site_url + KV_PAGE) as (session, report):
        browser.evaluate(session, "document.querySelector('.servebook-live button.servebook-live-run').click()")
        assert _wait_ready(browser, session) == "ready"
        _set(browser, session, "model", "llama-3.1-70b")
        _set(browser, session, "context_tokens", 1000)
        _set(browser, session, "kv_cache_dtype", "fp8")
        layout = kv_cache_layout(load_model_spec("llama-3.1-70b"), kv_cache_dtype="fp8")
        shown = _shown(browser, session)
        assert shown["kv_bytes_per_token"]["value"] == layout.kv_bytes_per_token
        assert shown["kv_bytes_per_sequence"]["value"] == min_kv_bytes_for_one_request(layout, 1000, in_flight_tokens=0)
        _set(browser, session, "context_tokens", "")   # a cleared box (a number box takes no letters)
        assert _error(browser, session) == "context_tokens '' is not a number; enter a whole number"
    assert not (report.blocked or report.exceptions or report.console_errors or report.failed), report


CHUNK_PAGE = "notebooks/chunk_budget.html"


def _chunk_offered_without_numpy() -> tuple[bool, str]:
    """Whether servebook.live offers the chunk calculator where numpy cannot be imported (as in
    Pyodide), and the reason it gives when not: what the page must then do."""
    import subprocess
    import sys

    code = ("import sys, json; sys.modules['numpy'] = None\n"
            "import servebook.live as live; o = live.options()\n"
            "print(json.dumps(['chunk' in o['calculators'], o['unavailable'].get('chunk', '')]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    offered, reason = json.loads(out.stdout)
    return offered, reason


def test_the_chunk_calculator_runs_live_or_says_why_not(site_url, browser):
    """Offered in the browser exactly when the step-time model imports without numpy; then its numbers
    are CPython's, else the page says why (never a silent failure)."""
    offered, reason = _chunk_offered_without_numpy()
    with watched_page(browser, site_url + CHUNK_PAGE) as (session, report):
        browser.evaluate(session, "document.querySelector('.servebook-live button.servebook-live-run').click()")
        state = _wait_ready(browser, session)
        status = browser.evaluate(session, "document.querySelector('.servebook-live-status').textContent")
        if not offered:
            assert state == "unavailable" and status == f"Not available in the browser: {reason}", (state, status)
        else:
            assert state == "ready", status
            from servebook.perf.chunk_budget import recommend_max_num_batched_tokens
            from servebook.perf.gpu import gpu_numbers
            from servebook.perf.model import calibrated_coefficients

            _set(browser, session, "target_step_ms", 80)
            spec, gpu = load_model_spec("gemma-4-31b"), gpu_numbers("H100")
            r = recommend_max_num_batched_tokens(spec, gpu, calibrated_coefficients(gpu.name)[0], target_step_s=0.080,
                                                 max_num_seqs=32, decode_context_tokens=8000, tp=4)
            shown = _shown(browser, session)
            assert shown["recommended"]["value"] == r["recommended"]
            assert shown["chunk_tokens"]["value"] == r["chunk_tokens"]
    assert not (report.blocked or report.exceptions or report.console_errors or report.failed), report


def test_the_site_ships_the_wheel_and_pyodide_it_loads(site_dir):
    """The build put a pure-Python servebook wheel with every data file, and Pyodide's runtime, in _vendor/."""
    import zipfile

    live_dir = site_dir / "_vendor" / "live"
    wheel = live_dir / json.loads((live_dir / "manifest.json").read_text())["wheel"]
    assert wheel.name.endswith("-py3-none-any.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    data = MODELS_DIR.parent
    shipped = {"servebook/" + p.relative_to(data.parent).as_posix() for p in data.rglob("*")
               if p.is_file() and "__pycache__" not in p.parts}
    assert "servebook/live.py" in names and not shipped - names, sorted(shipped - names)[:5]
    pyodide = site_dir / "_vendor" / "pyodide"
    version = json.loads((pyodide / "package.json").read_text())["version"]
    pinned = json.loads((site_dir.parents[1] / "package.json").read_text())["dependencies"]["pyodide"]
    assert version == pinned
    assert all((pyodide / f).stat().st_size > 0 for f in ("pyodide.mjs", "pyodide.asm.mjs", "pyodide.asm.wasm",
                                                          "python_stdlib.zip", "pyodide-lock.json"))


TUNE_PAGE = "book/06-11-chunked-prefill.html"
TUNE = ".servebook-live[data-calculator=tune]"
#: 6.11's tune directive (its starting values).
TUNE_START = {"model": "qwen3-32b", "gpu": "H200-SXM-141GB", "gpus": 4, "rate": 4, "input_tokens": 1024,
              "output_tokens": 256, "ttft_ms": 1000, "tpot_ms": 35}


def _tune_state(browser, session) -> tuple[str, int]:
    got = json.loads(browser.evaluate(session, f"""JSON.stringify((() => {{ const c = document.querySelector('{TUNE}');
      return [c.dataset.state, Number(c.dataset.computations || 0)]; }})())"""))
    return got[0], got[1]


def _commit(browser, session, name: str, value) -> None:
    """Type a value and commit it (Enter or leaving the box fires change); the tune calculator searches
    on change, after painting its status, so wait for the search to finish."""
    _, before = _tune_state(browser, session)
    browser.evaluate(session, f"""(() => {{
      const f = document.querySelector('{TUNE} [name={name}]');
      f.value = {json.dumps(str(value))};
      if (f.value !== {json.dumps(str(value))}) throw new Error('{name} has no option ' + {json.dumps(str(value))});
      f.dispatchEvent(new Event('change', {{bubbles: true}}));
    }})()""")
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        state, done = _tune_state(browser, session)
        if done > before and state == "ready":
            return
        time.sleep(0.2)
    raise AssertionError(f"the tune search did not finish after {name}={value}")


def _tune_shown(browser, session) -> dict:
    return json.loads(browser.evaluate(session, f"""JSON.stringify({{
      numbers: Object.fromEntries(Array.from(document.querySelectorAll('{TUNE} td[data-key]')).map((td) =>
        [td.dataset.key, JSON.parse(td.dataset.value)])),
      command: (document.querySelector('{TUNE} .servebook-live-command') || {{}}).textContent || null,
      picks: document.querySelectorAll('{TUNE} svg circle.pick').length,
      frontier: document.querySelectorAll('{TUNE} svg circle.frontier-point').length,
      error: (() => {{ const e = document.querySelector('{TUNE} .servebook-live-error');
                       return e.hidden ? null : e.textContent; }})()}})"""))


def _cpython(inputs: dict) -> dict:
    from servebook import live

    reply = live.compute({"calculator": "tune", **{k: str(v) for k, v in inputs.items()}})
    return reply


def test_the_tune_calculator_shows_cpythons_search(site_url, browser, artifacts_dir):
    """6.11's live search: the page's pick, numbers, serve line and frontier are CPython's for the
    same inputs (and so the CLI's: tests/test_live.py), and a bad value shows servebook.validation's message."""
    with watched_page(browser, site_url + TUNE_PAGE) as (session, report):
        browser.evaluate(session, f"document.querySelector('{TUNE} button.servebook-live-run').click()")
        deadline = time.monotonic() + READY_TIMEOUT_S
        while _tune_state(browser, session)[0] in ("idle", "loading") and time.monotonic() < deadline:
            time.sleep(0.2)
        status = browser.evaluate(session, f"document.querySelector('{TUNE} .servebook-live-status').textContent")
        assert _tune_state(browser, session)[0] == "ready", status

        inputs = dict(TUNE_START)
        for change in (None, ("tpot_ms", 50), ("model", "llama-3.1-70b"), ("rate", 8)):
            if change:
                _commit(browser, session, *change)
                inputs[change[0]] = change[1]
            want, shown = _cpython(inputs), _tune_shown(browser, session)
            assert shown["error"] is None, (change, shown["error"])
            assert shown["numbers"] == {n["key"]: n["value"] for n in want["numbers"]}, change
            assert shown["command"] == want.get("command"), change
            assert shown["picks"] == (want["pick"] is not None) and shown["frontier"] == len(want["frontier"]), change
            if change is None:
                _screenshot_control(browser, session, artifacts_dir / "run-live-tune.png", TUNE)

        _commit(browser, session, "gpus", 8)
        assert _tune_shown(browser, session)["error"] == _cpython({**inputs, "gpus": 8})["error"]
        assert _tune_shown(browser, session)["error"].startswith("gpus 8 is not allowed")
    assert not (report.blocked or report.exceptions or report.console_errors or report.failed), report
