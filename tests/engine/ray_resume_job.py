"""Run inside .venv-vllm (with ray[data]): ``servebook batch ray`` on a running Ray cluster.

argv: ADDRESS OUTPUT MODEL_DIR SHARD... The command the book prints, on a CPU engine
(``--cpu``) with the engine flags the single-engine reference uses too (:data:`ENGINE_FLAGS`).
It prints ``SERVEBOOK_RAY {json}`` (the run's summary) at the end and its progress bar on
stderr; run it again after a kill and it resumes from what OUTPUT holds.
"""
import sys

#: Engine flags shared with the reference `servebook batch run` (tests/engine/test_batch_ray.py).
ENGINE_FLAGS = ["--max-model-len", "256", "--load-format", "dummy", "--enforce-eager", "--dtype", "float32",
                "--max-num-seqs", "2", "--seed", "0"]


def main() -> int:
    import ray_loopback  # noqa: F401  (keeps ray.init(address="127.0.0.1:...") on loopback)
    from servebook.cli import main as servebook

    address, output, model, *shards = sys.argv[1:]
    return servebook(["batch", "ray", *shards, "-o", output, "--model", model, "--address", address, "--cpu",
                      "--replicas", "1", "--batch-size", "4", "--flush-rows", "2", *ENGINE_FLAGS])


if __name__ == "__main__":
    sys.exit(main())
