"""Paths of the data files servebook ships inside its package (declared as package data).

Recorded lab results are not shipped: :mod:`servebook.records` finds them.
"""
from __future__ import annotations

from pathlib import Path

#: ``servebook/data``: the GPU catalogue, model configs, coefficients, drills, vLLM claims.
DATA_DIR = Path(__file__).resolve().parent / "data"
#: vLLM facts the book names (flags, defaults, log lines, metrics), checked by the drift test against the pinned release.
VLLM_CLAIMS = DATA_DIR / "vllm_claims.toml"
#: Public ``config.json`` files of the reference models (``<id>.json``).
MODELS_DIR = DATA_DIR / "models"
#: GPU start-ups (config, flags, log) the shipped memory coefficients are fitted on.
STARTUP_LOGS_DIR = DATA_DIR / "startup_logs"
#: vLLM 0.27.1 CPU start-ups of tiny models (config, flags, log): the KV sizing servebook predicts to the token.
CPU_STARTUP_LOGS_DIR = DATA_DIR / "cpu_startup_logs"
#: A recorded ``vllm bench serve`` capture (server log, /metrics, bench output) the drills show.
BENCH_DIR = DATA_DIR / "bench"
#: The end-to-end jobs recorded on the H200 (models, workload shapes, request counts): servebook.lab.e2e.plan.
E2E_JOBS = DATA_DIR / "e2e_jobs.toml"
#: The chapter's worked example (one deployment, memory to cost): servebook.simulator.worksheet.
WORKED_EXAMPLE = DATA_DIR / "worked_example.toml"
#: The directory that holds the ``servebook`` package: put it on an engine child's PYTHONPATH.
PACKAGE_PARENT = Path(__file__).resolve().parent.parent
