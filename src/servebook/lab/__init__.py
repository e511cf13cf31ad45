"""The lab harness: real vLLM engines for the GPU labs (and their CPU smoke runs).

* :class:`VllmServer` — ``vllm serve`` in its own process group on 127.0.0.1, ``/health``
  wait, parsed start-up log, ``/metrics``; always torn down (module :mod:`.server`).
* :func:`run_bench` — load with ``vllm bench serve``, per-request timings (:mod:`.bench`).
* :func:`run_offline` — ``LLM(...)`` starts/generate and the HF static-batching baseline in a
  subprocess (:mod:`.offline`).
* :func:`get_profile` — ``cpu-smoke`` or ``gpu`` (:mod:`.profiles`).
* :func:`save_result` — JSON with provenance (:mod:`.results`).
* :mod:`.recorded` — recorded results read back (schema and provenance checked);
  :mod:`.rerecordings` compares a re-recording with the run it replaced, :mod:`.engine_stats` reads
  prefix-cache hit rates and running requests from a recording.
* One module per lab for Labs 1–6 (:mod:`.lab1_memory`, :mod:`.lab2_batching`, :mod:`.lab3_preemption`,
  :mod:`.lab4_fp8_kv`, :mod:`.lab5_chunked_prefill`, :mod:`.lab6_prefix_caching`): its tables, summaries,
  figure and reader, which the lab and its results page (``labs/results_l<N>.md``) share.
"""
from servebook.lab.bench import run_bench
from servebook.lab.errors import EngineStartError, LabError, PortInUseError
from servebook.lab.metrics import delta, metric, parse_metrics
from servebook.lab.offline import JobResult, engine_provenance, run_offline
from servebook.lab.profiles import Profile, get_profile
from servebook.lab.results import load_result, save_result
from servebook.lab.server import VllmServer, free_port
from servebook.lab.table import ratio, side_by_side

__all__ = [
    "EngineStartError", "JobResult", "LabError", "PortInUseError", "Profile", "VllmServer",
    "delta", "engine_provenance", "free_port", "get_profile", "load_result", "metric",
    "parse_metrics", "ratio", "run_bench", "run_offline", "save_result", "side_by_side",
]
