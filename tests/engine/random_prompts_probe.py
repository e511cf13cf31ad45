"""Prompts of ``vllm bench serve --dataset-name random`` for a lab's model directory, as the server sees them.

Run in the vLLM environment: ``python random_prompts_probe.py CONFIG.json WORKDIR NUM INPUT_LEN SEED``
writes the model directory of CONFIG.json with ``servebook.tiny_model.write_model_dir`` (as
``Profile.model_dir`` does) into WORKDIR/model, then answers in WORKDIR/probe.json. The tokenizer is loaded the way ``vllm bench serve`` loads it (``vllm.tokenizers.get_tokenizer``);
the prompts are vLLM's own ``RandomDataset(random_seed=SEED).sample(...)``; each prompt text is then
encoded as ``/v1/completions`` does (special tokens added, so BOS first). Also decodes the whole
vocabulary, one id at a time (``roundtrip_bad_single``: ids that did not come back as themselves),
then the rest in runs of 2,048 consecutive ids, as ``RandomDataset`` does with every prompt
(``roundtrip_bad_runs``: the first id of each run that did not come back whole).
"""
import json
import sys
import time
from pathlib import Path

from vllm.benchmarks.datasets import RandomDataset
from vllm.tokenizers import get_tokenizer

from servebook.tiny_model import write_model_dir

config_path, workdir = Path(sys.argv[1]), Path(sys.argv[2])
num, input_len, seed = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
t_write = time.perf_counter()
model_dir = str(write_model_dir(workdir / "model", json.loads(config_path.read_text())))
t0 = time.perf_counter()
tok = get_tokenizer(model_dir)
t1 = time.perf_counter()
requests = RandomDataset(random_seed=seed).sample(tokenizer=tok, num_requests=num, input_len=input_len,
                                                  output_len=1)
t2 = time.perf_counter()
special = set(tok.all_special_ids)
every = [i for i in range(tok.vocab_size) if i not in special]
texts = tok.batch_decode([[i] for i in every])
singles = tok(texts, add_special_tokens=False)["input_ids"]
bad_single = [i for i, back in zip(every, singles) if back != [i]]
# RandomDataset decodes runs of consecutive ids into one text: the tokens must stay apart there too.
rest, bad_runs, run = [i for i in every if i not in set(bad_single)], [], 2048
for start in range(0, len(rest), run):
    ids = rest[start:start + run]
    if tok.encode(tok.decode(ids), add_special_tokens=False) != ids:
        bad_runs.append(ids[0])
t3 = time.perf_counter()
json.dump({
    "vocab_size": tok.vocab_size, "special_ids": sorted(special),
    "num_special_tokens_to_add": tok.num_special_tokens_to_add(),
    "prompt_lens": [r.prompt_len for r in requests],
    "server_ids": [tok.encode(r.prompt) for r in requests],
    "roundtrip_bad_single": bad_single, "roundtrip_bad_runs": bad_runs, "seconds": {"write": t0 - t_write, "load": t1 - t0, "sample": t2 - t1, "roundtrip": t3 - t2},
}, open(workdir / "probe.json", "w"))
