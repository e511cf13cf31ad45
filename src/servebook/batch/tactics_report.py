"""Read Lab 8's result files (schema ``servebook.batch_tactics/1``) and summarise them.

``labs/l8_batch_tactics.md`` calls these functions on the document its run just wrote; the
results page (``labs/recorded_results.md``) and section 6.23 call them on the recorded file, so
the lab and the book print the same table from one code path.

* :func:`load_tactics` — one result file, schema and provenance checked.
* :func:`best` / :func:`tactics_rows` / :func:`tactic_ratios` — the lab's table and speed-ups.
* :func:`max_prefix_hit_tokens` — the most prefix-cache hits the workload allows.
* :func:`plot_tactics` — output throughput per case, axis in tokens/s.

Standard library only (matplotlib inside :func:`plot_tactics`): no engine is needed to read a result.
"""
from __future__ import annotations

from pathlib import Path

from servebook.lab.errors import LabError
from servebook.records import results_path

SCHEMA = "servebook.batch_tactics/1"
#: Where the GPU runs are committed, under the name the lab's Record cell gives them.
RECORDED_DIR = results_path("batch_tactics")
#: Top-level fields a result must carry to be rendered (provenance and the measurement itself).
REQUIRED = ("date", "profile", "gpu", "vllm_version", "model_id", "config", "config_sha256", "engine_args",
            "profile_settings", "cases")
_RUN_FIELDS = ("wall_s", "requests", "output_tokens", "requests_per_s", "output_tokens_per_s")
#: (label, slower case, faster case) of each speed-up the lab reports.
RATIOS = (
    ("length-sorted vs shuffled", "order-shuffled", "order-length-sorted"),
    ("prefix-grouped vs length-sorted", "order-length-sorted", "order-prefix-grouped+length-sorted"),
    ("tight vs loose max_tokens", "max-tokens-loose", "llm-generate"),
    ("LLM.generate vs HTTP", "http-server", "llm-generate"),
)


def recorded_tactics_path(profile: str = "gpu") -> Path:
    """The newest ``labs/results/batch_tactics/l8-<profile>-*.json`` (by the date that ends its name)."""
    found = sorted(RECORDED_DIR.glob(f"l8-{profile}-*.json"), key=lambda p: (p.stem[-10:], p.name))
    if not found:
        raise LabError(f"{RECORDED_DIR}: no l8-{profile}-*.json; run Lab 8 "
                       "(bash labs/tools/run_labs_gpu.sh l8) and copy its JSON here unedited")
    return found[-1]


def load_tactics(path: str | Path) -> dict:
    """Read one Lab 8 result file and check it is data the book may render.

    Raises:
        LabError: the file is missing or not JSON, its ``schema`` is not
            ``servebook.batch_tactics/1``, a provenance field (GPU name/count/driver, vLLM version,
            date, model config, engine arguments) is missing, or a case has no complete run. The
            message names the file and what to change.
    """
    from servebook.lab.recorded import read_checked_document

    doc = read_checked_document(path, schema=SCHEMA, required=REQUIRED, what="Lab 8 result",
                                record_hint="run the lab (labs/tools/run_labs_gpu.sh l8) to record it",
                                provenance_word="")
    if not isinstance(doc["cases"], list):
        raise LabError(f"{path}: cases must be a list, found {type(doc['cases']).__name__}")
    for i, case in enumerate(doc["cases"]):
        name = case.get("name") if isinstance(case, dict) else None
        if not name:
            raise LabError(f"{path}: case {i} has no name; the file is not as the lab wrote it")
        runs = case.get("runs")
        if not runs:
            raise LabError(f"{path}: case {name!r} has no runs; re-run the lab (a case that did not run is not "
                           "written)")
        for j, run in enumerate(runs):
            absent = [k for k in _RUN_FIELDS if run.get(k) is None]
            if absent:
                raise LabError(f"{path}: case {name!r} run {j} lacks {', '.join(absent)}")
    return doc


def best(case: dict) -> dict:
    """The fastest repeat of a case (fewest seconds), the usual way to quote a throughput run."""
    return min(case["runs"], key=lambda r: r["wall_s"])


def _cases(doc: dict) -> dict:
    return {c["name"]: c for c in doc["cases"]}


def tactics_rows(doc: dict) -> list[dict]:
    """One row per case, best repeat: wall s, req/s, out tok/s, out tok, prefix hit share.

    ``prefix hit share`` is prefix-cache hit tokens / queried tokens over the case (from
    ``vllm:prefix_cache_hits`` and ``vllm:prefix_cache_queries``); None where the engine reported
    none (the HTTP case reads no engine metrics).
    """
    rows = []
    for case in doc["cases"]:
        r = best(case)
        hit, query = r.get("prefix_cache_hit_tokens"), r.get("prefix_cache_query_tokens")
        rows.append({"case": case["name"], "wall s": r["wall_s"], "req/s": r["requests_per_s"],
                     "out tok/s": r["output_tokens_per_s"], "out tok": r["output_tokens"],
                     "prefix hit share": None if not query else hit / query})
    return rows


def tactic_ratios(doc: dict) -> dict[str, float]:
    """Speed-up of each tactic: wall time of the slower case / wall time of the faster (best repeats).

    Keys are the labels of :data:`RATIOS`; a pair with a case that did not run (the HTTP case under
    ``--no-server``) is left out.
    """
    cases = _cases(doc)
    return {label: best(cases[slow])["wall_s"] / best(cases[fast])["wall_s"]
            for label, slow, fast in RATIOS if slow in cases and fast in cases}


def max_prefix_hit_tokens(doc: dict) -> int:
    """The most prefix-cache hit tokens the workload allows in one case.

    Each shared prefix is computed once, by the first request that carries it; every later request
    can at best reuse all of it (the tails are random and share nothing). So:
    (requests - prefixes) x prefix tokens, rounded down to whole KV blocks.
    """
    settings = doc["profile_settings"]
    w, block = settings["workload"], settings["block_tokens"]
    return (w["num_requests"] - w["num_prefixes"]) * (w["prefix_tokens"] // block * block)


def plot_tactics(doc: dict, title: str | None = None):
    """Horizontal bars: output tokens per second of each case (best repeat). Returns the figure."""
    import matplotlib.pyplot as plt

    rows = tactics_rows(doc)
    fig, ax = plt.subplots(figsize=(7, 3.2))
    ax.barh([r["case"] for r in rows], [r["out tok/s"] for r in rows], color="tab:blue")
    ax.set_xlabel("output tokens per second (whole job, best repeat)")
    ax.set_ylabel("case")
    ax.set_title(title or f"Lab 8, {doc['profile']}: {doc['gpu'].get('name')}, vLLM {doc['vllm_version']}")
    ax.invert_yaxis()
    fig.tight_layout()
    return fig
