"""Lab 7's target/draft pair: trained here for the speculative-decoding lab (real weights, offline).

Speculation's acceptance is a property of *two trained models agreeing*: with
``load_format="dummy"`` the weights are random, and a draft of the same shape as the
target even gets the *same* random weights (acceptance 100 %), so nothing measured
means anything. This module builds a real pair anywhere, with no download:

* corpus: the Python standard library's own ``.py`` sources (present wherever Python
  is), files in sorted order; the last files are held out for prompts;
* tokenizer: a byte-level BPE trained on the corpus with ``tokenizers`` (one vocabulary
  shared by both models, as vLLM's draft-model method requires);
* models: two ``LlamaForCausalLM`` (transformers), a target and a smaller draft,
  trained with plain torch (AdamW, next-token cross-entropy) on the same batches;
  an *untrained* draft of the draft's shape is saved beside them as a control;
* output: ``OUT/target``, ``OUT/draft``, ``OUT/draft_untrained`` (``save_pretrained``,
  safetensors, plus the tokenizer) and ``OUT/pair.json`` (sizes, losses, seconds,
  held-out prompts as token ids, and the offline agreement: the fraction of positions
  of the target's own greedy continuations at which the draft's greedy token is the
  target's — the per-token acceptance greedy speculation should see).

Run in the engine's Python (it has torch, transformers and tokenizers)::

    python -m servebook.lab.analyses.lab7_train_pair OUT --profile cpu-smoke     # or gpu, or --sizes JSON

From the book's Python, :func:`train_pair_in_engine_env` runs it there under the
engine lock (training uses the same cores an engine would). Seeded: the same sizes,
seed, corpus and thread count give the same weights on CPU.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

from servebook.errors import ServebookError

#: Keys a sizes dict must have (see ``LAB_PARAMS[...]["l7"]["train"]``).
MODEL_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
              "intermediate_size")
SIZE_KEYS = ("vocab_size", "seq_len", "batch_size", "steps", "lr", "corpus_bytes", "target", "draft")
EOS_TOKEN = "<|endoftext|>"


# ---------------------------------------------------------------------------
# Pure parts (no torch): sizes, configs, corpus


def check_sizes(sizes: dict) -> dict:
    """Validate a sizes dict; returns it. Raises ServebookError saying what to change."""
    missing = [k for k in SIZE_KEYS if k not in sizes]
    if missing:
        raise ServebookError(f"training sizes lack {', '.join(missing)}; give all of {', '.join(SIZE_KEYS)}")
    for key in ("vocab_size", "seq_len", "batch_size", "steps", "corpus_bytes"):
        if int(sizes[key]) != sizes[key] or sizes[key] < 1:
            raise ServebookError(f"training size {key}={sizes[key]!r} must be a whole number >= 1")
    if sizes["vocab_size"] < 300:
        raise ServebookError(f"vocab_size={sizes['vocab_size']} is too small for a byte-level BPE "
                             "(256 bytes + 1 special token + merges): use 300 or more")
    if not 0 < float(sizes["lr"]) < 1:
        raise ServebookError(f"learning rate lr={sizes['lr']} must be in (0, 1)")
    for role in ("target", "draft"):
        m = sizes[role]
        lack = [k for k in MODEL_KEYS if k not in m]
        if lack:
            raise ServebookError(f"{role} model sizes lack {', '.join(lack)}")
        if m["hidden_size"] % m["num_attention_heads"]:
            raise ServebookError(f"{role}: hidden_size {m['hidden_size']} is not a multiple of "
                                 f"num_attention_heads {m['num_attention_heads']}")
        if m["num_attention_heads"] % m["num_key_value_heads"]:
            raise ServebookError(f"{role}: num_attention_heads {m['num_attention_heads']} is not a multiple of "
                                 f"num_key_value_heads {m['num_key_value_heads']}")
    if parameter_count(sizes["draft"], sizes["vocab_size"]) >= parameter_count(sizes["target"], sizes["vocab_size"]):
        raise ServebookError("the draft must be smaller than the target: shrink draft hidden_size or layers")
    return sizes


def llama_config(model: dict, *, vocab_size: int, max_position_embeddings: int, dtype: str) -> dict:
    """A ``config.json`` dict for a ``LlamaForCausalLM`` of the given shape (untied embeddings)."""
    heads = int(model["num_attention_heads"])
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": int(model["hidden_size"]), "intermediate_size": int(model["intermediate_size"]),
        "num_hidden_layers": int(model["num_hidden_layers"]), "num_attention_heads": heads,
        "num_key_value_heads": int(model["num_key_value_heads"]),
        "head_dim": int(model["hidden_size"]) // heads, "vocab_size": int(vocab_size),
        "max_position_embeddings": int(max_position_embeddings), "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": False,
        "bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0, "attention_bias": False, "mlp_bias": False,
        "initializer_range": 0.02, "torch_dtype": dtype,
    }


def parameter_count(model: dict, vocab_size: int) -> int:
    """Parameters of a Llama of this shape (untied embeddings, no biases)."""
    h, inter, layers = int(model["hidden_size"]), int(model["intermediate_size"]), int(model["num_hidden_layers"])
    head_dim = h // int(model["num_attention_heads"])
    kv = int(model["num_key_value_heads"]) * head_dim
    per_layer = h * h * 2 + h * kv * 2 + 3 * h * inter + 2 * h
    return layers * per_layer + 2 * vocab_size * h + h


def stdlib_dir() -> Path:
    """The standard library's source folder of the running Python."""
    return Path(sysconfig.get_paths()["stdlib"])


#: Folders of the standard library left out of a recursive corpus (tests, vendored packages, IDLE).
SKIP_DIRS = ("test", "tests", "site-packages", "dist-packages", "idlelib", "lib2to3", "__pycache__")


def corpus_files(max_bytes: int, *, root: Path | None = None, holdout_files: int = 4,
                 recursive: bool = False) -> tuple[list[Path], list[Path]]:
    """(training files, held-out files): ``*.py`` of ``root`` (the stdlib), sorted by relative path.

    ``recursive=False`` takes the top-level modules only (about 4.7 MB in CPython 3.11);
    ``recursive=True`` adds the packages, except :data:`SKIP_DIRS`. Training files are taken
    in order until they hold ``max_bytes``; the held-out files are the ``holdout_files``
    files that come after them (never trained on).
    """
    root = Path(root or stdlib_dir())
    found = root.rglob("*.py") if recursive else root.glob("*.py")
    files = sorted((p for p in found if p.is_file() and not set(p.relative_to(root).parts[:-1]) & set(SKIP_DIRS)),
                   key=lambda p: p.relative_to(root).as_posix())
    if len(files) <= holdout_files:
        raise ServebookError(f"{root} holds {len(files)} .py files; the corpus needs more than {holdout_files} "
                             "(point root at a Python standard library with its sources)")
    train: list[Path] = []
    size = 0
    for p in files[:-holdout_files]:
        if size >= max_bytes:
            break
        train.append(p)
        size += p.stat().st_size
    rest = files[len(train):]
    return train, rest[:holdout_files]


def read_text(files: list[Path], max_bytes: int | None = None) -> str:
    """The files' text joined by blank lines (cut at ``max_bytes`` characters when given)."""
    text = "\n\n".join(p.read_text(encoding="utf-8", errors="replace") for p in files)
    return text[:max_bytes] if max_bytes else text


# ---------------------------------------------------------------------------
# Torch parts (engine's Python)


def train_tokenizer(text: str, vocab_size: int):
    """A byte-level BPE of ``vocab_size`` tokens trained on ``text`` (id 0 = ``<|endoftext|>``)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS_TOKEN], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_chunks(text), trainer=trainer)
    return tok


def _chunks(text: str, size: int = 1 << 16):
    for i in range(0, len(text), size):
        yield text[i:i + size]


def save_tokenizer(tok, out: Path, max_len: int) -> None:
    """``tokenizer.json`` + ``tokenizer_config.json`` that transformers and vLLM load offline."""
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS_TOKEN, bos_token=EOS_TOKEN,
                                   unk_token=EOS_TOKEN, pad_token=EOS_TOKEN, model_max_length=max_len)
    fast.save_pretrained(str(out))


def _build(model_cfg: dict, seed: int):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = dict(model_cfg)
    cfg.pop("architectures", None)
    cfg.pop("model_type", None)
    cfg.pop("torch_dtype", None)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**cfg))
    return model.float()


def _mixed_precision(device: str):
    """bf16 autocast on CUDA (weights and optimizer stay float32); nothing on CPU."""
    import contextlib

    import torch

    return torch.autocast(device_type="cuda", dtype=torch.bfloat16) if device == "cuda" else contextlib.nullcontext()


def _lr_at(step: int, steps: int, lr: float) -> float:
    warm = max(1, steps // 20)
    if step < warm:
        return lr * (step + 1) / warm
    return lr * 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, steps - warm)))


def _train(models: dict, data, sizes: dict, seed: int, device: str, log_every: int) -> dict:
    """Train every model in ``models`` on the same seeded batches; returns losses per model."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    opts = {name: torch.optim.AdamW(m.parameters(), lr=sizes["lr"], betas=(0.9, 0.95), weight_decay=0.01)
            for name, m in models.items()}
    seq, batch, steps = sizes["seq_len"], sizes["batch_size"], sizes["steps"]
    losses = {name: [] for name in models}
    for m in models.values():
        m.train()
    t0 = time.perf_counter()
    for step in range(steps):
        starts = torch.randint(0, len(data) - seq - 1, (batch,), generator=gen)
        x = torch.stack([data[s:s + seq + 1] for s in starts.tolist()]).to(device)
        for name, model in models.items():
            for group in opts[name].param_groups:
                group["lr"] = _lr_at(step, steps, sizes["lr"])
            with _mixed_precision(device):
                logits = model(input_ids=x[:, :-1]).logits
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(),
                                                     x[:, 1:].reshape(-1))
            opts[name].zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opts[name].step()
            losses[name].append(loss.item())
        if log_every and (step % log_every == 0 or step == steps - 1):
            print(f"step {step:5d}/{steps}  " + "  ".join(f"{n} loss {losses[n][-1]:.3f}" for n in models)
                  + f"  ({time.perf_counter() - t0:.1f} s)", flush=True)
    for m in models.values():
        m.eval()
    return losses


def greedy_agreement(target, draft, prompts: list[list[int]], new_tokens: int, device: str = "cpu") -> float:
    """Fraction of the target's greedy tokens the draft also predicts greedily, in the same context.

    The target continues each prompt greedily for ``new_tokens`` tokens; at each of those
    positions the draft sees the same prefix. That is the per-token acceptance greedy
    speculative decoding sees whenever the earlier drafts were accepted.
    """
    import torch

    agree = total = 0
    with torch.inference_mode():
        for p in prompts:
            ids = torch.tensor([p], device=device)
            for _ in range(new_tokens):
                nxt = target(input_ids=ids).logits[0, -1].argmax()
                ids = torch.cat([ids, nxt.view(1, 1)], dim=1)
            t_pred = target(input_ids=ids[:, :-1]).logits[0].argmax(-1)
            d_pred = draft(input_ids=ids[:, :-1]).logits[0].argmax(-1)
            sl = slice(len(p) - 1, ids.shape[1] - 1)
            agree += int((t_pred[sl] == d_pred[sl]).sum())
            total += int(t_pred[sl].numel())
    return agree / total


def held_out_prompts(tok, text: str, *, count: int, length: int) -> list[list[int]]:
    """``count`` prompts of ``length`` tokens, from evenly spaced line starts of held-out ``text``."""
    ids = tok.encode(text).ids
    if len(ids) < length + 1:
        raise ServebookError(f"held-out text has {len(ids)} tokens, fewer than a {length}-token prompt")
    starts = [round(i * (len(ids) - length) / max(1, count)) for i in range(count)]
    return [ids[s:s + length] for s in starts]


def train_pair(out_dir: str | Path, sizes: dict, *, seed: int = 0, device: str = "cpu", dtype: str = "float32",
               num_prompts: int = 64, prompt_len: int = 32, agreement_tokens: int = 16,
               log_every: int = 50) -> dict:
    """Train target and draft, save both (and an untrained draft) in HF format; returns the manifest.

    Args:
        out_dir: folder to write ``target/``, ``draft/``, ``draft_untrained/``, ``pair.json``.
        sizes: see :func:`check_sizes` (``LAB_PARAMS[profile]["l7"]["train"]``); an optional
            ``torch_threads`` sets torch's thread count (1 on a shared 2-core machine, where
            two threads spinning against other processes trained 17x slower).
        seed: seeds the initial weights, the batches and the draft control.
        device: ``"cpu"`` or ``"cuda"``.
        dtype: dtype written to ``config.json`` and the safetensors (``float32`` keeps greedy
            text identical between engines on CPU; ``bfloat16`` is what a GPU serves).
        num_prompts / prompt_len: held-out prompts written to the manifest (token ids).
        agreement_tokens: greedy tokens per prompt for the offline agreement (8 prompts).
    """
    import torch

    check_sizes(sizes)
    t_start = time.perf_counter()
    if sizes.get("torch_threads"):
        torch.set_num_threads(int(sizes["torch_threads"]))
    torch.manual_seed(seed)
    if device == "cpu":
        torch.use_deterministic_algorithms(True)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    train_files, held_files = corpus_files(int(sizes["corpus_bytes"]), recursive=bool(sizes.get("corpus_recursive")))
    text = read_text(train_files, int(sizes["corpus_bytes"]))
    t0 = time.perf_counter()
    tok = train_tokenizer(text, int(sizes["vocab_size"]))
    data = torch.tensor(tok.encode(text).ids, dtype=torch.long)
    tokenizer_s = time.perf_counter() - t0
    vocab = tok.get_vocab_size()
    max_len = max(2048, 4 * (prompt_len + agreement_tokens))
    configs = {role: llama_config(sizes[role], vocab_size=vocab, max_position_embeddings=max_len, dtype=dtype)
               for role in ("target", "draft")}
    print(f"corpus: {len(train_files)} stdlib files, {len(text):,} characters -> {len(data):,} tokens "
          f"(vocab {vocab}, tokenizer {tokenizer_s:.1f} s)", flush=True)
    models = {role: _build(configs[role], seed + i).to(device) for i, role in enumerate(("target", "draft"))}
    untrained = _build(configs["draft"], seed + 99).to(device)
    t0 = time.perf_counter()
    losses = _train(models, data, sizes, seed, device, log_every)
    train_s = time.perf_counter() - t0
    prompts = held_out_prompts(tok, read_text(held_files), count=num_prompts, length=prompt_len)
    t0 = time.perf_counter()
    agreement = greedy_agreement(models["target"], models["draft"], prompts[:8], agreement_tokens, device)
    agreement_untrained = greedy_agreement(models["target"], untrained, prompts[:8], agreement_tokens, device)
    agreement_s = time.perf_counter() - t0
    torch_dtype = getattr(torch, dtype)
    for role, model in (("target", models["target"]), ("draft", models["draft"]), ("draft_untrained", untrained)):
        folder = out / role
        model.to(torch_dtype).save_pretrained(str(folder), safe_serialization=True)
        cfg = json.loads((folder / "config.json").read_text())
        cfg["torch_dtype"] = dtype
        (folder / "config.json").write_text(json.dumps(cfg, indent=1))
        save_tokenizer(tok, folder, max_len)
    tail = max(1, sizes["steps"] // 10)
    manifest = {
        "seed": seed, "device": device, "dtype": dtype, "sizes": sizes, "vocab_size": vocab,
        "corpus": {"source": "Python standard library sources", "root": str(stdlib_dir()),
                   "python": sys.version.split()[0], "files": [p.relative_to(stdlib_dir()).as_posix() for p in train_files],
                   "held_out_files": [p.relative_to(stdlib_dir()).as_posix() for p in held_files], "characters": len(text), "tokens": len(data)},
        "parameters": {role: parameter_count(sizes[role], vocab) for role in ("target", "draft")},
        "configs": configs,
        "final_loss": {role: sum(v[-tail:]) / tail for role, v in losses.items()},
        "first_loss": {role: v[0] for role, v in losses.items()},
        "chance_loss": math.log(vocab),
        "offline_greedy_agreement": {"trained_draft": agreement, "untrained_draft": agreement_untrained,
                                     "chance": 1 / vocab, "prompts": 8, "tokens_per_prompt": agreement_tokens},
        "seconds": {"tokenizer": tokenizer_s, "train_both": train_s, "agreement": agreement_s,
                    "total": time.perf_counter() - t_start},
        "torch_threads": torch.get_num_threads(), "torch_version": torch.__version__,
        "prompts": prompts,
        "dirs": {role: str(out / role) for role in ("target", "draft", "draft_untrained")},
    }
    (out / "pair.json").write_text(json.dumps(manifest, indent=1))
    print(f"trained in {train_s:.1f} s; final loss target {manifest['final_loss']['target']:.3f}, draft "
          f"{manifest['final_loss']['draft']:.3f} (chance {math.log(vocab):.3f}); greedy agreement: trained "
          f"draft {agreement:.2f}, untrained {agreement_untrained:.3f}", flush=True)
    return manifest


# ---------------------------------------------------------------------------
# Book side: run it in the engine's Python


def train_pair_in_engine_env(out_dir: str | Path, sizes: dict, *, env: dict | None = None, seed: int = 0,
                             device: str = "cpu", dtype: str = "float32", timeout_s: float = 1800,
                             lock: bool = True) -> dict:
    """Run :func:`train_pair` in the vLLM environment's Python (under the engine lock); returns the manifest.

    The training log is printed. Raises :class:`servebook.lab.errors.LabError` with the
    child's last output when it fails.
    """
    from servebook.engine_env import vllm_python
    from servebook.lab.errors import LabError
    from servebook.lab.harness.server import timed_engine_lock
    from servebook.shipped import PACKAGE_PARENT

    check_sizes(sizes)
    out = Path(out_dir)
    env = dict(env or os.environ)
    src = str(PACKAGE_PARENT)
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    cmd = [str(vllm_python()), "-m", "servebook.lab.analyses.lab7_train_pair", str(out), "--sizes", json.dumps(sizes),
           "--seed", str(seed), "--device", device, "--dtype", dtype]
    ctx = timed_engine_lock() if lock else _Null()
    with ctx:
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
        except subprocess.TimeoutExpired:
            raise LabError(f"training the pair took over {timeout_s:.0f} s: lower steps or sizes, "
                           "or raise timeout_s") from None
    print("\n".join(l for l in proc.stdout.splitlines() if not l.startswith("{")))
    if proc.returncode != 0 or not (out / "pair.json").exists():
        raise LabError(f"training the target/draft pair failed (exit {proc.returncode}): "
                       f"{(proc.stderr or proc.stdout).strip()[-1500:]}")
    return json.loads((out / "pair.json").read_text())


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m servebook.lab.analyses.lab7_train_pair",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("out", help="output folder (target/, draft/, draft_untrained/, pair.json)")
    parser.add_argument("--profile", choices=("cpu-smoke", "gpu"), help="take sizes from LAB_PARAMS[profile]['l7']")
    parser.add_argument("--sizes", help="sizes as JSON (instead of --profile)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    parser.add_argument("--dtype", default=None, help="float32 or bfloat16 (default: the profile's)")
    args = parser.parse_args(argv)
    try:
        if args.sizes:
            sizes, dtype = json.loads(args.sizes), args.dtype or "float32"
        elif args.profile:
            from servebook.lab.harness.profiles import LAB_PARAMS

            l7 = LAB_PARAMS[args.profile]["l7"]
            sizes, dtype = l7["train"], args.dtype or l7["dtype"]
        else:
            raise ServebookError("give --profile cpu-smoke|gpu or --sizes JSON")
        device = args.device
        if device is None:
            import torch

            device = "cuda" if torch.cuda.is_available() else "cpu"
        train_pair(args.out, sizes, seed=args.seed, device=device, dtype=dtype)
    except ServebookError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
