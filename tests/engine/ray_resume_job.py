"""Run inside .venv-vllm (with ray[data]): resume a Ray Data + vLLM job whose first attempt died.

argv: INPUT OUTPUT_DIR MODEL_DIR. Prints ``SERVEBOOK_RAY {json}`` with the attempt written and
what was collected.
"""
import json
import os
import sys

from servebook.batch import ray_data


def main() -> None:
    src, out_dir, model = sys.argv[1:4]
    env_vars = {k: os.environ[k] for k in ("VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND",
                                           "VLLM_NO_USAGE_STATS", "HF_HUB_OFFLINE", "PYTHONPATH") if k in os.environ}
    attempt = ray_data.run_on_ray(
        src, out_dir, model=model, concurrency=1, batch_size=8,
        engine_kwargs={"max_model_len": 256, "load_format": "dummy", "enforce_eager": True, "dtype": "float32",
                       "max_num_seqs": 16, "seed": 0},
        processor_kwargs=ray_data.CPU_PROCESSOR_KWARGS,
        ray_init_kwargs={"num_cpus": 2, "include_dashboard": False, "runtime_env": {"env_vars": env_vars}})
    got = ray_data.collect_ray_outputs(out_dir)
    print("SERVEBOOK_RAY " + json.dumps({"attempt": attempt.name, "records": got.records,
                                         "duplicate_lines": got.duplicate_lines, "torn_lines": got.torn_lines}),
          flush=True)


if __name__ == "__main__":
    main()
