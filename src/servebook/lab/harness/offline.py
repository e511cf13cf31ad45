"""Run offline jobs (``LLM(...)`` starts, ``generate``, the HF static-batching baseline) in a subprocess.

The child is ``python -m servebook.lab.harness.offline_child`` in the engine's Python, in its own
process group, under the engine lock; its whole output is kept and split per job, so each
engine start has its own start-up log to parse. The group is killed on exit, exception or
KeyboardInterrupt. ``isolate=True`` gives every job a fresh child (on a GPU, so that each
engine starts with the device memory the previous one held given back).
"""
from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time

from servebook.engine_env import vllm_python
from servebook.lab.errors import LabError
from servebook.lab.harness.offline_child import BEGIN, END
from servebook.lab.harness.server import engine_error_line, hint_for, kill_group, timed_engine_lock
from servebook.startup_log import StartupLog, parse_startup_log


class JobResult(dict):
    """``{"job", "ok", "result", "error", "error_line", "hint", "wall_s", "log"}``."""

    @property
    def startup(self) -> StartupLog:
        """The job's start-up log, parsed."""
        return parse_startup_log(self["log"])


def _split(output: str, jobs: list[dict]) -> list[JobResult]:
    results: list[JobResult] = []
    current: list[str] | None = None
    for line in output.splitlines():
        if line.startswith(BEGIN + " "):
            current = []
            continue
        if line.startswith(END + " "):
            _, i, payload = line.split(" ", 2)
            res = JobResult(json.loads(payload))
            log = "\n".join(current or [])
            res.update(job=jobs[int(i)], log=log)
            if not res["ok"]:
                res["error_line"] = engine_error_line(log) or res["error"]
                res["hint"] = hint_for(log + "\n" + res["error"])
            results.append(res)
            current = None
            continue
        if current is not None:
            current.append(line)
    return results


def _run_child(jobs: list[dict], env: dict | None, timeout_s: float) -> tuple[str, int | None]:
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(jobs, f)
        path = f.name
    proc = subprocess.Popen([str(vllm_python()), "-m", "servebook.lab.harness.offline_child", path],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, start_new_session=True, stdin=subprocess.DEVNULL)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
        return out, proc.returncode
    except subprocess.TimeoutExpired:
        kill_group(proc.pid, 5)
        out, _ = proc.communicate()
        raise LabError(f"offline jobs did not finish within {timeout_s:.0f} s; raise timeout_s. "
                       f"Last output:\n{(out or '')[-2000:]}") from None
    finally:
        kill_group(proc.pid, 5)
        os.unlink(path)


def run_offline(jobs: list[dict], *, env: dict | None = None, timeout_s: float = 900.0,
                isolate: bool = False, lock: bool = True) -> list[JobResult]:
    """Run ``jobs`` (see :mod:`servebook.lab.harness.offline_child` for kinds); one :class:`JobResult` each.

    A job that fails has ``ok`` False with the engine's ``error_line`` and a ``hint``; the
    other jobs still run. Raises :class:`LabError` when the child dies without reporting.
    """
    batches = [[j] for j in jobs] if isolate else [list(jobs)]
    results: list[JobResult] = []
    with timed_engine_lock() if lock else _null():
        for batch in _progress(batches, len(jobs)):
            t0 = time.monotonic()
            out, code = _run_child(batch, env, timeout_s)
            got = _split(out, batch)
            if len(got) < len(batch):
                raise LabError(f"the offline child exited with status {code} after {time.monotonic() - t0:.0f} s "
                               f"having reported {len(got)} of {len(batch)} jobs; its error: "
                               f"{engine_error_line(out) or out[-1500:]}")
            results += got
    return results


def _progress(batches: list, n_jobs: int):
    """A tqdm bar over the children when there are several (GPU runs), else the list as is."""
    if len(batches) < 2:
        return batches
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return batches
    return tqdm(batches, desc=f"offline jobs ({n_jobs})")


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


_PROVENANCE: dict[str, dict] = {}


def engine_provenance(env: dict | None = None) -> dict:
    """GPU/driver/torch and vLLM version as the engine's Python sees them (cached per process)."""
    key = (env or {}).get("PYTHONPATH", "")
    if key not in _PROVENANCE:
        [res] = run_offline([{"kind": "provenance"}], env=env, timeout_s=300, lock=False)
        if not res["ok"]:
            raise LabError(f"could not read provenance in the engine environment: {res['error']}")
        _PROVENANCE[key] = res["result"]
    return _PROVENANCE[key]
