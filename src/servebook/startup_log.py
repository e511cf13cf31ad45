"""Read the numbers a vLLM engine prints while it starts.

:func:`parse_startup_log` takes the text of a start-up log (any prefix before
the message is ignored: timestamps, ``INFO``, ``(EngineCore_DP0 pid=123)``,
``(Worker pid=7)``, ANSI colours) and returns a :class:`StartupLog`.

Formats recognised, with the vLLM source that prints them (paths relative to
the ``vllm`` package of the release named):

* ``Initializing a V1 LLM engine (v0.27.1) with config: ...``
  (``v1/engine/core.py``, 0.26.0 and 0.27.1); older V0 releases print
  ``Initializing an LLM engine (v0.6.3) with config: ...``.
* ``Model loading took 14.99 GiB memory and 4.2 seconds``
  (``v1/worker/gpu_model_runner.py``) and ``Model loading took 14.99 GiB and
  4.2 seconds`` (``v1/worker/gpu/model_runner.py``, model runner V2).
* ``Available KV cache memory: 104.33 GiB`` (``v1/worker/gpu_worker.py``,
  ``Worker.determine_available_memory``; GiB rounded to 2 decimals by
  ``utils/mem_utils.format_gib``).
* CPU: ``Explicitly set (1.0/11.59) GiB for KV cache on node 0.`` and
  ``Auto set (X/Y) GiB for KV cache on node N, ...`` (``v1/worker/cpu_worker.py``).
* 0.26.0: ``Free memory on device (F/T GiB) on startup. Desired GPU memory
  utilization is (U, R GiB). Actual usage is W GiB for weight, A GiB for peak
  activation, N GiB for non-torch memory, and G GiB for CUDAGraph memory. ...
  Current kv cache memory in use is K GiB.`` (``v1/worker/gpu_worker.py``,
  ``compile_or_warm_up_model``).
* 0.27.1 prints the same sentence with ``Actual usage is C GiB for consumed
  memory (weights + non-torch), A GiB for peak activation, and G GiB for
  CUDAGraph memory.`` (there ``A`` already includes the CUDA-graph estimate).
* ``CUDA graph pool memory: X GiB (actual), Y GiB (estimated), difference: ...``
  (``v1/worker/gpu_worker.py``) and ``Estimated CUDA graph memory: Y GiB total``
  (``v1/worker/gpu_model_runner.py``, ``profile_cudagraph_memory``; 0.26.0 and
  0.27.1). Only the V1 model runner prints them: the V2 runner's
  ``profile_cudagraph_memory`` returns 0 without a line, and then nothing is
  subtracted for CUDA graphs before the KV cache is sized.
* ``Using V2 Model Runner`` (``v1/worker/gpu_worker.py``, 0.26.0 and 0.27.1).
* ``GPU KV cache size: 682,625 tokens`` and ``Maximum concurrency for 2,000
  tokens per request: 341.31x`` (``v1/core/kv_cache_utils.py``,
  ``get_kv_cache_configs``; the two may also share one line). 0.32.0 prints
  them as one line that names the pool's device: ``CPU KV cache size: 7,168 tokens,
  Maximum concurrency for 512 tokens per request: 14.00x``
  (``update_kv_cache_capacity``); both forms are read.
* ``Add 8 padding layers, may waste at most 15.38% KV cache memory``
  (``_get_kv_cache_groups_uniform_page_size``).
* ``Setting kv cache block size to 64 for FLASHMLA backend.``
  (``platforms/interface.py``, ``update_block_size_for_backend``).
* ``Chunked prefill is enabled with max_num_batched_tokens=8192.``
  (``config/scheduler.py``) and ``Using max model len 2000`` (``config/model.py``).
* V0 releases: ``# GPU blocks: 27153, # CPU blocks: 2048`` (0.4/0.5
  ``executor/gpu_executor.py``), ``# cuda blocks: 27153, # CPU blocks: 2048``
  (0.6 ``executor/executor_base.py``, device name first) and ``# CPU blocks: N``
  alone (CPU backend, whose "GPU" blocks live in host memory).

Sizes are returned in bytes as well as the GiB the log printed; bytes derived
from a 2-decimal GiB figure carry up to 0.005 GiB (5 MiB) of rounding.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from servebook.errors import ServebookError
from servebook.kv_cache import PaddingSummary

GIB = 2**30

_NUM = r"(-?\d+(?:\.\d+)?)"
_INT = r"(\d[\d,]*)"

_ANSI = re.compile(r"\x1b\[[0-9;]*m")

_PATTERNS: dict[str, re.Pattern[str]] = {
    "version": re.compile(r"Initializing an? (?:V1 )?LLM engine \(v([0-9][^)\s]*)\)"),
    "model_loading": re.compile(r"Model loading took " + _NUM + r" GiB(?: memory)? and " + _NUM + r" seconds"),
    "available_kv": re.compile(r"Available KV cache memory: " + _NUM + r" GiB"),
    "cpu_kv": re.compile(r"(Explicitly|Auto) set \(" + _NUM + r"/" + _NUM + r"\) GiB for KV cache"),
    "free_on_startup": re.compile(
        r"Free memory on device \(" + _NUM + r"/" + _NUM + r" GiB\) on startup\. "
        r"Desired GPU memory utilization is \(" + _NUM + r", " + _NUM + r" GiB\)\."
    ),
    "usage_026": re.compile(
        r"Actual usage is " + _NUM + r" GiB for weight, " + _NUM + r" GiB for peak activation, "
        + _NUM + r" GiB for non-torch memory, and " + _NUM + r" GiB for CUDAGraph memory"
    ),
    "usage_027": re.compile(
        r"Actual usage is " + _NUM + r" GiB for consumed memory \(weights \+ non-torch\), "
        + _NUM + r" GiB for peak activation, and " + _NUM + r" GiB for CUDAGraph memory"
    ),
    "kv_in_use": re.compile(r"Current kv cache memory in use is " + _NUM + r" GiB"),
    "cudagraph_estimate": re.compile(r"Estimated CUDA graph memory: " + _NUM + r" GiB total"),
    "v2_runner": re.compile(r"Using V2 Model Runner"),
    "cudagraph_pool": re.compile(
        r"CUDA graph pool memory: " + _NUM + r" GiB \(actual\), " + _NUM + r" GiB \(estimated\)"
    ),
    # 0.26.0/0.27.1: ``GPU KV cache size: N tokens``; 0.32.0 names the device the pool lives on
    # (``CPU KV cache size``, ``GPU + host`` with host offload) and prints the concurrency on the same line
    "kv_tokens": re.compile(r"\b(?:GPU|[A-Z]{2,4})(?: \+ host)? KV cache size: " + _INT + r" tokens"),
    "concurrency": re.compile(
        r"Maximum concurrency for " + _INT + r" tokens per request: " + _NUM + r"x"
    ),
    "padding": re.compile(
        r"Add (\d+) padding layers, may waste at most " + _NUM + r"% KV cache memory"
    ),
    "block_size": re.compile(r"Setting kv cache block size to (\d+) for (\S+) backend"),
    "max_num_batched_tokens": re.compile(
        r"Chunked prefill is enabled with max_num_batched_tokens=(\d+)"
    ),
    "max_model_len": re.compile(r"Using max model len (\d+)"),
    "v0_blocks": re.compile(r"# (\w+) blocks: (\d+)(?:, # CPU blocks: (\d+))?"),
}


def _gib_to_bytes(gib: float | None) -> int | None:
    return None if gib is None else round(gib * GIB)


@dataclass(frozen=True)
class StartupLog(PaddingSummary):
    """Numbers read from one engine start-up log (None where the log is silent).

    GiB fields are the figures as printed (2 decimals); ``*_bytes`` properties
    convert them (``2**30`` bytes per GiB).

    Attributes:
        vllm_version: release from the ``Initializing ... engine (vX)`` line.
        model_loading_gib: ``Model loading took X GiB`` (weights per GPU).
        model_loading_s: seconds from the same line.
        available_kv_cache_gib: ``Available KV cache memory`` (GPU; the smallest
            over TP ranks), or the CPU worker's ``Explicitly/Auto set (X/...) GiB
            for KV cache``.
        host_total_gib: CPU: total memory of the NUMA node (``/Y`` above).
        free_on_startup_gib: ``Free memory on device (F/...)``.
        total_memory_gib: ``Free memory on device (.../T GiB)``.
        gpu_memory_utilization: the ``U`` of ``Desired GPU memory utilization is (U, R GiB)``.
        requested_memory_gib: the ``R`` of the same.
        weights_gib: 0.26 ``A GiB for weight``.
        peak_activation_gib: ``B GiB for peak activation`` (0.27.1: includes
            the CUDA-graph estimate).
        non_torch_gib: 0.26 ``C GiB for non-torch memory``.
        consumed_gib: 0.27.1 ``C GiB for consumed memory (weights + non-torch)``.
        cudagraph_gib: ``D GiB for CUDAGraph memory`` (what capturing took,
            printed after the KV cache was sized; 0.0 with ``--enforce-eager``).
        cudagraph_actual_gib: ``CUDA graph pool memory: X GiB (actual)``.
        cudagraph_estimated_gib: the estimate the engine subtracted before
            sizing the KV cache: ``Estimated CUDA graph memory: Y GiB total``
            (or the ``(estimated)`` figure of the pool line); None when the
            log has neither (eager, or the V2 model runner, which estimates 0).
        model_runner: ``"v2"`` when the log says ``Using V2 Model Runner``, else None.
        kv_in_use_gib: ``Current kv cache memory in use is K GiB``.
        kv_cache_tokens: ``GPU KV cache size: N tokens`` (0.32.0: ``<DEVICE> KV cache size``).
        max_concurrency: ``Maximum concurrency ... X.XXx`` (2 decimals).
        concurrency_max_model_len: the ``M`` of ``for M tokens per request``.
        padding_layers / padding_waste_pct: from the padding warning(s);
            ``padding_warnings`` keeps each ``(N, P)``.
        block_size / block_size_backend: when the backend changed the block size.
        max_num_batched_tokens / max_model_len: scheduler and model lines.
        v0_gpu_blocks / v0_cpu_blocks: ``# GPU blocks`` of V0 releases.
    """

    vllm_version: str | None = None
    model_loading_gib: float | None = None
    model_loading_s: float | None = None
    available_kv_cache_gib: float | None = None
    host_total_gib: float | None = None
    free_on_startup_gib: float | None = None
    total_memory_gib: float | None = None
    gpu_memory_utilization: float | None = None
    requested_memory_gib: float | None = None
    weights_gib: float | None = None
    peak_activation_gib: float | None = None
    non_torch_gib: float | None = None
    consumed_gib: float | None = None
    cudagraph_gib: float | None = None
    cudagraph_actual_gib: float | None = None
    cudagraph_estimated_gib: float | None = None
    model_runner: str | None = None
    kv_in_use_gib: float | None = None
    kv_cache_tokens: int | None = None
    max_concurrency: float | None = None
    concurrency_max_model_len: int | None = None
    padding_warnings: tuple[tuple[int, float], ...] = field(default_factory=tuple)
    block_size: int | None = None
    block_size_backend: str | None = None
    max_num_batched_tokens: int | None = None
    max_model_len: int | None = None
    v0_gpu_blocks: int | None = None
    v0_cpu_blocks: int | None = None

    @property
    def available_kv_cache_bytes(self) -> int | None:
        """``available_kv_cache_gib`` in bytes (to within 0.005 GiB)."""
        return _gib_to_bytes(self.available_kv_cache_gib)

    @property
    def model_loading_bytes(self) -> int | None:
        """``model_loading_gib`` in bytes (to within 0.005 GiB)."""
        return _gib_to_bytes(self.model_loading_gib)

    @property
    def has_capacity(self) -> bool:
        """True when the log reached the KV cache sizing lines."""
        return self.kv_cache_tokens is not None or self.v0_gpu_blocks is not None


def _strip(line: str) -> str:
    return _ANSI.sub("", line)


def _f(s: str) -> float:
    return float(s)


def _i(s: str) -> int:
    return int(s.replace(",", ""))


#: What a recognised line gives: a (field, converter) pair per group of its pattern, in group order.
#: Where two lines give one field the later entry wins: 0.27's usage line over 0.26's, the estimate
#: line over the pool line. Lines that need more than a conversion are read in parse_startup_log.
_FIELDS: dict[str, tuple[tuple[str, Callable[[str], object]], ...]] = {
    "version": (("vllm_version", str),),
    "model_loading": (("model_loading_gib", _f), ("model_loading_s", _f)),
    "free_on_startup": (("free_on_startup_gib", _f), ("total_memory_gib", _f), ("gpu_memory_utilization", _f),
                        ("requested_memory_gib", _f)),
    "usage_026": (("weights_gib", _f), ("peak_activation_gib", _f), ("non_torch_gib", _f), ("cudagraph_gib", _f)),
    "usage_027": (("consumed_gib", _f), ("peak_activation_gib", _f), ("cudagraph_gib", _f)),
    "kv_in_use": (("kv_in_use_gib", _f),),
    "cudagraph_pool": (("cudagraph_actual_gib", _f), ("cudagraph_estimated_gib", _f)),
    "cudagraph_estimate": (("cudagraph_estimated_gib", _f),),
    "kv_tokens": (("kv_cache_tokens", _i),),
    "concurrency": (("concurrency_max_model_len", _i), ("max_concurrency", _f)),
    "block_size": (("block_size", int), ("block_size_backend", str)),
    "max_num_batched_tokens": (("max_num_batched_tokens", int),),
    "max_model_len": (("max_model_len", int),),
}

def parse_startup_log(text: str) -> StartupLog:
    """Parse the text of a vLLM start-up log (see the module docstring for formats).

    The first occurrence of each line wins (tensor-parallel workers repeat
    some lines), except ``Available KV cache memory``, where the smallest
    rank's figure is kept because the engine sizes every rank by it. Raises :class:`ServebookError` when the text
    contains none of the recognised lines, which usually means it is not a vLLM
    log or the engine failed before profiling.
    """
    if not isinstance(text, str):
        raise ServebookError("parse_startup_log expects the log text (str); read the file first")
    found: dict[str, object] = {}
    padding: list[tuple[int, float]] = []
    available: list[float] = []
    for raw in text.splitlines():
        line = _strip(raw)
        for key, pattern in _PATTERNS.items():
            m = pattern.search(line)
            if not m:
                continue
            if key == "padding":
                padding.append((int(m.group(1)), _f(m.group(2))))
                continue
            if key == "available_kv":
                available.append(_f(m.group(1)))
            if key in found:
                continue
            found[key] = m
    if not found and not padding:
        raise ServebookError(
            "no vLLM start-up lines found (looked for 'GPU/CPU KV cache size', 'Available KV cache "
            "memory', 'Model loading took', ...); pass the engine's full start-up output"
        )
    values: dict[str, object] = {"padding_warnings": tuple(padding)}

    def group(key: str) -> re.Match[str] | None:
        return found.get(key)  # type: ignore[return-value]

    for key, fields in _FIELDS.items():
        if m := group(key):
            values.update((name, convert(g)) for (name, convert), g in zip(fields, m.groups(), strict=True))
    if available:
        # Every TP rank prints its own figure; the engine sizes all ranks by the smallest
        # (get_kv_cache_configs: "Change the num_blocks of each rank to the smallest").
        values["available_kv_cache_gib"] = min(available)
    elif m := group("cpu_kv"):
        values["available_kv_cache_gib"] = _f(m.group(2))
        values["host_total_gib"] = _f(m.group(3))
    if group("v2_runner"):
        values["model_runner"] = "v2"
    if m := group("v0_blocks"):
        # "# GPU blocks: N, # CPU blocks: M" (0.4/0.5), "# cuda blocks: N, ..." (0.6,
        # device name), "# CPU blocks: N" alone (CPU backend: its device blocks).
        values["v0_gpu_blocks"] = int(m.group(2))
        if m.group(3) is not None:
            values["v0_cpu_blocks"] = int(m.group(3))
    return StartupLog(**values)  # type: ignore[arg-type]


def read_startup_log(path: str | Path) -> StartupLog:
    """Parse a start-up log file; a missing file is a :class:`ServebookError`."""
    p = Path(path)
    try:
        text = p.read_text(errors="replace")
    except OSError as exc:
        raise ServebookError(f"cannot read start-up log {p}: {exc.strerror}; check the path") from None
    return parse_startup_log(text)
