"""The lab harness: real vLLM engines for the GPU labs (and their CPU smoke runs), and what measures them.

* :class:`VllmServer` — ``vllm serve`` in its own process group on 127.0.0.1, ``/health``
  wait, parsed start-up log, ``/metrics``; always torn down (module :mod:`.server`; ``vllm`` itself
  runs through :mod:`.vllm_cli`).
* :func:`run_bench` — load with ``vllm bench serve``, per-request timings (:mod:`.bench`);
  :mod:`.random_prompts` says which prompts it sends.
* :func:`run_offline` — ``LLM(...)`` starts/generate and the HF static-batching baseline in a
  subprocess (:mod:`.offline`, child :mod:`.offline_child`).
* :func:`get_profile` — ``cpu-smoke`` or ``gpu`` (:mod:`.profiles`).
* :func:`save_result` — JSON with provenance (:mod:`.results`).
* Measuring: :mod:`.metrics` and :mod:`.histogram` (``/metrics``), :mod:`.step_recorder` and
  :mod:`.step_log` (every engine step), :mod:`.itl` and :mod:`.token_load` (streaming and token-id
  loads), :mod:`.prefix` (shared-prefix workloads), :mod:`.concurrency` (requests held at once).
* Running: :mod:`.deadline` (time left under the runner's cap), :mod:`.split` (a sweep in parts),
  :mod:`.run_notebook` (a lab page headless), :mod:`.table` (predict-then-measure tables).
"""
from servebook.lab.errors import EngineStartError, LabError, PortInUseError
from servebook.lab.harness.bench import run_bench
from servebook.lab.harness.metrics import delta, metric, parse_metrics
from servebook.lab.harness.offline import JobResult, engine_provenance, run_offline
from servebook.lab.harness.profiles import Profile, get_profile
from servebook.lab.harness.results import load_result, save_result
from servebook.lab.harness.server import VllmServer, free_port
from servebook.lab.harness.table import ratio, side_by_side

__all__ = [
    "EngineStartError", "JobResult", "LabError", "PortInUseError", "Profile", "VllmServer",
    "delta", "engine_provenance", "free_port", "get_profile", "load_result", "metric",
    "parse_metrics", "ratio", "run_bench", "run_offline", "save_result", "side_by_side",
]
