"""Where recorded lab results are: the one module that knows the repository's ``labs/results``.

Everything servebook ships (model configs, the GPU catalogue, fitted coefficients and the
start-up logs they were fitted on, the step-time calibration, the drills) lives inside the
package. What the GPU labs *recorded* does not: it stays in the book's checkout, under
``labs/results/``, and every reader asks this module where that folder is:

1. an explicit ``directory`` argument;
2. else ``$SERVEBOOK_RESULTS_DIR``;
3. else the nearest ``labs/results`` folder at or above the current directory (a page,
   notebook or lab run anywhere inside the checkout finds it);
4. else the ``labs/results`` of the checkout this package was imported from (an
   editable install run from elsewhere).

When none exists the path of step 3 at the current directory is returned, so that a
reader's ``FileNotFoundError``/``ServebookError`` names a path the user can create or
replace with ``SERVEBOOK_RESULTS_DIR``. Subfolders: ``labs`` (one JSON per lab run),
``step_timing`` (H200 step timings the calibration is fitted on), ``batch_tactics``
(Lab 8), ``raw``, ``startup_logs``, ``e2e`` (end-to-end jobs, :func:`e2e_results`).

Readers the chapter pages call: :func:`read_json` (any recorded document), :func:`step_times`
(one step-timing file's decode steps and prefills), :func:`recorded_startup` (one recorded
engine start-up, parsed) and :func:`e2e_results`.
"""
from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

#: Environment variable naming the results folder (the folder that holds ``labs/``, ``step_timing/`` ...).
RESULTS_ENV = "SERVEBOOK_RESULTS_DIR"
#: The results folder, relative to the root of a book checkout.
_RESULTS_IN_CHECKOUT = Path("labs") / "results"


def _found_upward(start: Path) -> Path | None:
    for base in (start, *start.parents):
        candidate = base / _RESULTS_IN_CHECKOUT
        if candidate.is_dir():
            return candidate
    return None


def results_dir(directory: str | Path | None = None) -> Path:
    """The recorded-results folder (see the module docstring for the order it is looked up in)."""
    if directory is not None:
        return Path(directory)
    if os.environ.get(RESULTS_ENV):
        return Path(os.environ[RESULTS_ENV])
    found = _found_upward(Path.cwd().resolve())
    if found is None:
        found = _found_upward(Path(__file__).resolve().parent)
    return found if found is not None else Path.cwd() / _RESULTS_IN_CHECKOUT


def results_path(*parts: str, directory: str | Path | None = None) -> Path:
    """A path inside the results folder, e.g. ``results_path("labs", "l1_memory_gpu.json")``."""
    return results_dir(directory).joinpath(*parts)


def read_json(*parts: str, directory: str | Path | None = None) -> dict:
    """A recorded JSON document, e.g. ``read_json("step_timing", "qwen3-32b.json")`` (pages read results this way).

    A missing file raises ``FileNotFoundError`` naming the path and how to point at another results folder.
    """
    path = results_path(*parts, directory=directory)
    if not path.is_file():
        raise FileNotFoundError(
            f"no recorded result at {path}: run from inside the book's checkout, or set {RESULTS_ENV} "
            f"to a results folder that holds {Path(*parts).as_posix()}")
    return json.loads(path.read_text())


#: Schema of an end-to-end job record (:mod:`servebook.lab.e2e.job`).
E2E_SCHEMA = "servebook.e2e/1"


def e2e_results(directory: str | Path | None = None, folder: str = "e2e") -> list[dict]:
    """Every end-to-end job record (``e2e/e2e_<model>[-<suffix>].json``, schema ``servebook.e2e/1``), by model id.

    ``directory`` is a results folder (see :func:`results_dir`) or a folder holding the files
    themselves (a test's fixtures). Raises ``FileNotFoundError`` naming the folder when it holds
    none, and ``ValueError`` naming a file of another schema. ``folder``: ``e2e`` (the jobs compared with
    fleet), ``e2e_repeat`` (jobs repeated on one engine to isolate one-time costs), ``e2e_routing``
    (gpt-oss-20b's one-time costs and sampling) or ``e2e_attention`` (decode at long contexts): the last
    three are rendered, not compared.
    """
    base = results_dir(directory)
    folder = base / folder if (base / folder).is_dir() else base
    paths = sorted(folder.glob("e2e_*.json"))
    if not paths:
        raise FileNotFoundError(f"no end-to-end job records (e2e_*.json) in {folder}: record them with "
                                f"labs/tools/run_labs_gpu.sh e2e-a / e2e-b, or set {RESULTS_ENV}")
    docs = []
    for path in paths:
        doc = json.loads(path.read_text())
        if doc.get("schema") != E2E_SCHEMA:
            raise ValueError(f"{path} has schema {doc.get('schema')!r}, not {E2E_SCHEMA!r}; "
                             "keep only servebook.lab.e2e.job records in that folder")
        docs.append(doc)
    return sorted(docs, key=lambda d: d["model_id"])


def checkout_root(directory: str | Path | None = None) -> Path:
    """The book checkout that holds the results folder (where labs run and ``.venv-vllm`` lives)."""
    results = results_dir(directory).resolve()
    depth = len(_RESULTS_IN_CHECKOUT.parts)
    return results.parents[depth - 1] if len(results.parents) >= depth else results


class StepTimes:
    """One recorded step-timing file (``step_timing/<model_file>.json``, one engine on one GPU).

    ``decode_s[(batch, prompt_tokens)]`` is the recorded decode step, in seconds, with ``batch``
    sequences whose prompts held ``prompt_tokens`` tokens; ``prefill_s[tokens]`` the recorded
    prefill of one prompt of ``tokens`` tokens, in seconds; ``decode_rows`` and ``prefill_rows``
    the recorded rows themselves (what :mod:`servebook.figures` plots); ``decode_samples_s`` the
    repeats behind each decode step (seconds; the step is their median). ``vllm_version``,
    ``gpu_name``, ``gpu_count``, ``engine_args`` and ``record`` (the whole document) say where and
    how it was measured.
    """

    def __init__(self, record: dict, where: str = "record"):
        if not record.get("cases"):
            raise ValueError(f"{where} holds no case; record it with the step-timing lab")
        result = record["cases"][0]["result"]
        self.record = record
        self.vllm_version: str = record["vllm_version"]
        self.gpu_name: str = record["gpu"]["name"]
        self.gpu_count: int = record["gpu"].get("count", 1)
        self.engine_args: dict = record["cases"][0]["engine_args"]
        self.decode_rows: list[dict] = result["decode"]
        self.prefill_rows: list[dict] = result["prefill"]
        self.decode_s = {(r["batch"], r["prompt_tokens"]): r["step_s"] for r in self.decode_rows}
        self.decode_samples_s = {(r["batch"], r["prompt_tokens"]): list(r.get("samples_s") or [r["step_s"]])
                                 for r in self.decode_rows}
        self.prefill_s = {r["tokens"]: r["time_s"] for r in self.prefill_rows}


def step_times(model_file: str, directory: str | Path | None = None, *, folder: str = "step_timing") -> StepTimes:
    """The recorded step timings of ``<folder>/<model_file>.json`` (e.g. ``"qwen3-32b"``), first case.

    ``folder="step_timing_repeats"`` reads the runs that repeat each decode point five times
    (:attr:`StepTimes.decode_samples_s` holds the repeats)."""
    return StepTimes(read_json(folder, f"{model_file}.json", directory=directory), f"{folder}/{model_file}.json")


class RecordedStartup:
    """One engine start-up recorded in ``startup_logs/<file_name>`` (a file holds several cases).

    ``log`` is the start-up log parsed (:class:`servebook.startup_log.StartupLog`), ``text`` the log
    itself, ``engine_args`` how the engine was started; ``vllm_version`` and ``gpu_name`` say where.
    """

    def __init__(self, record: dict, case: dict):
        from servebook.startup_log import parse_startup_log

        self.vllm_version: str = record["vllm_version"]
        self.gpu_name: str = record["gpu"]["name"]
        self.name: str = case["name"]
        self.engine_args: dict = case["engine_args"]
        self.text: str = case["log"]
        self.log = parse_startup_log(self.text)


def recorded_startup(file_name: str, case: str, directory: str | Path | None = None) -> RecordedStartup:
    """The start-up ``case`` (e.g. ``"llama-3.1-8b--util50"``) of ``startup_logs/<file_name>``.

    An unknown case raises ``KeyError`` listing the file's cases.
    """
    record = read_json("startup_logs", file_name, directory=directory)
    names = [c["name"] for c in record["cases"]]
    if case not in names:
        raise KeyError(f"startup_logs/{file_name} has no case {case!r}; its cases are {', '.join(names)}")
    return RecordedStartup(record, record["cases"][names.index(case)])


SERVE_LATENCY_SCHEMA = "servebook.serve_latency/1"


def serve_latency_results(folder: str = "serve_issue37", directory: str | Path | None = None) -> list[dict]:
    """Every ``vllm serve`` latency record (``<folder>/serve_<name>.json``, schema
    ``servebook.serve_latency/1``, written by ``labs/tools/serve_latency.py``), by server name.

    Each record gains ``config_json``: the model's config.json the engine loaded, read from the
    path the record names (relative to the checkout) and checked against the record's
    ``config_sha256``, and ``declaration``: the folder's ``heldout.toml`` (parsed). Raises
    ``FileNotFoundError`` naming the folder when it holds no record.
    """
    import tomllib

    from servebook.provenance import config_sha256
    from servebook.tiny_model import language_model_config

    base = results_dir(directory) / folder
    # a record may be stored gzip-compressed (serve_NAME.json.gz), byte for byte what the tool wrote:
    # the per-request gaps make these the largest records, and every GPU call carries the working tree
    paths = sorted([*base.glob("serve_*.json"), *base.glob("serve_*.json.gz")])
    if not paths:
        raise FileNotFoundError(f"no serve latency records (serve_*.json[.gz]) in {base}: record them with "
                                "labs/tools/serve_latency.py, or set " + RESULTS_ENV)
    declaration = tomllib.loads((base / "heldout.toml").read_text()) if (base / "heldout.toml").exists() else {}
    root = checkout_root(directory)
    docs = []
    for path in paths:
        doc = json.loads(gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_text())
        if doc.get("schema") != SERVE_LATENCY_SCHEMA:
            raise ValueError(f"{path} has schema {doc.get('schema')!r}, not {SERVE_LATENCY_SCHEMA!r}")
        cfg = json.loads((root / doc["config"]).read_text())
        if config_sha256(language_model_config(cfg)) != doc["config_sha256"]:
            raise ValueError(f"{doc['config']} is not the config {path.name} was recorded with (sha256 differs)")
        doc["config_json"] = cfg
        doc["declaration"] = declaration
        docs.append(doc)
    return sorted(docs, key=lambda d: d["name"])
