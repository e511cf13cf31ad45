"""Sphinx extension: the ``live-calculator`` directive, a "Run live" control on a page.

    ```{live-calculator} plan
    :model: llama-3.1-70b
    :tp: 2
    ```

puts a button on the page; a click loads Pyodide and the servebook wheel from the book's own
``_vendor/`` folder and binds plain HTML controls to :mod:`servebook.live` (the script is
``book/_ext/live/servebook-live.js``; scripts/_common.sh copies it, Pyodide and the wheel there).
The calculator is ``plan`` (memory budget, KV capacity, recommended flags), ``kv`` (KV per token
and per sequence), ``chunk`` (the prefill chunk within a target step time), ``speculation`` (one
speculative step, n-gram drafter), ``fleet`` (a batch job's fleet plan) or ``tune`` (the cheapest
deployment meeting p90 TTFT/TPOT targets at an arrival rate, with its Pareto frontier); the last four
need the step-time model to import without numpy to run in the browser. The options set the controls'
starting values (else servebook.live.DEFAULTS).
Only pages with the directive load the script (a few KB); Pyodide loads on the click.
"""
from __future__ import annotations

import html
import json

from docutils import nodes
from docutils.parsers.rst import Directive, directives

CALCULATORS = ("plan", "kv", "chunk", "speculation", "fleet", "tune")
SCRIPT = "../_vendor/live/servebook-live.js"   # Sphinx resolves it against _static/
STYLE = "../_vendor/live/servebook-live.css"
INTRO = ("Runs servebook itself in this page: Python in WebAssembly (Pyodide), about 14 MB loaded "
         "from this site when you click, nothing from anywhere else. The numbers then follow the controls.")


class live_calculator(nodes.General, nodes.Element):
    """The control's placeholder; rendered as HTML, dropped by other builders."""


def _html(calculator: str, defaults: dict) -> str:
    return (
        f'<div class="servebook-live" data-calculator="{calculator}" '
        f'data-defaults="{html.escape(json.dumps(defaults, sort_keys=True))}" data-state="idle">'
        '<button type="button" class="servebook-live-run" disabled>Run live</button> '
        f'<span class="servebook-live-status">{html.escape(INTRO)}</span>'
        '<div class="servebook-live-controls"></div>'
        '<p class="servebook-live-error" role="alert" hidden></p>'
        '<div class="servebook-live-output"></div>'
        "</div>"
    )


def _visit_html(self, node: live_calculator) -> None:
    self.body.append(_html(node["calculator"], node["defaults"]))
    raise nodes.SkipNode


def _skip(self, node: live_calculator) -> None:
    raise nodes.SkipNode


class LiveCalculator(Directive):
    required_arguments = 1
    option_spec = {
        "model": directives.unchanged_required,
        "gpu": directives.unchanged_required,
        "tp": directives.positive_int,
        "max_model_len": directives.positive_int,
        "context_tokens": directives.positive_int,
        "gpu_memory_utilization": float,
        "max_num_seqs": directives.positive_int,
        "target_step_ms": float,
        "k": directives.positive_int,
        "acceptance": float,
        "batch": directives.positive_int,
        "gpus": directives.positive_int,
        "requests": directives.positive_int,
        "input_tokens": directives.positive_int,
        "output_tokens": directives.positive_int,
        "max_num_batched_tokens": directives.positive_int,
        "cudagraph_max_tokens": directives.nonnegative_int,
        "kv_cache_dtype": directives.unchanged_required,
        "rate": float,
        "ttft_ms": float,
        "tpot_ms": float,
    }

    def run(self):
        calculator = self.arguments[0]
        if calculator not in CALCULATORS:
            raise self.error(f"live-calculator {calculator!r}: use one of {', '.join(CALCULATORS)}")
        try:
            defaults = _checked(dict(self.options))
        except ValueError as exc:  # servebook's errors are ValueErrors that say what to change
            raise self.error(f"live-calculator {calculator}: {exc}") from None
        return [live_calculator(calculator=calculator, defaults=defaults)]


def _checked(defaults: dict) -> dict:
    """The page's starting values, checked against what the controls offer; GPU names made canonical
    (the GPU control lists the catalogue's names, e.g. H200-SXM-141GB for H200)."""
    from servebook.hardware import get_gpu
    from servebook.hf_config import reference_model_ids
    from servebook.plan import KV_CACHE_DTYPES

    if "model" in defaults and defaults["model"] not in reference_model_ids():
        raise ValueError(f"model {defaults['model']!r} is not a shipped reference model; use one of "
                         f"{', '.join(reference_model_ids())}")
    if "gpu" in defaults:
        defaults["gpu"] = get_gpu(defaults["gpu"]).name
    if defaults.get("kv_cache_dtype", "auto") not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype {defaults['kv_cache_dtype']!r}: use one of {', '.join(KV_CACHE_DTYPES)}")
    return defaults


def _add_assets(app, pagename, templatename, context, doctree) -> None:
    if doctree is not None and next(iter(doctree.findall(live_calculator)), None) is not None:
        app.add_js_file(SCRIPT)
        app.add_css_file(STYLE)


def setup(app):
    app.add_node(live_calculator, html=(_visit_html, None), latex=(_skip, None), text=(_skip, None),
                 man=(_skip, None), texinfo=(_skip, None))
    app.add_directive("live-calculator", LiveCalculator)
    app.connect("html-page-context", _add_assets)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
