"""``servebook models``: the reference models (or any config.json) as the calculators see them."""
from __future__ import annotations

import json

from servebook.hf_config import active_matmul_params, load_model_spec, reference_model_ids

GIB = 2**30


def register(sub) -> None:
    p = sub.add_parser(
        "models",
        help="list reference models, or describe config.json files: layers, parameters, weight and KV bytes",
    )
    p.add_argument(
        "sources",
        nargs="*",
        metavar="MODEL",
        help="reference id (e.g. llama-3.1-8b), config.json, or a directory holding one; default: all reference models",
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)


def describe(source: str) -> dict:
    """One model's summary (counts in parameters, sizes in bytes)."""
    spec = load_model_spec(source)
    kinds = [layer.kind for layer in spec.layers]
    return {
        "model": spec.name,
        "architecture": spec.architecture,
        "layers": spec.num_layers,
        "full_layers": kinds.count("full"),
        "sliding_layers": kinds.count("sliding"),
        "mla_layers": kinds.count("mla"),
        "params_total": spec.params.total,
        "params_active": spec.params.active,
        "params_active_matmul": active_matmul_params(spec),
        "weight_bytes": spec.weight_bytes,
        "kv_bytes_per_token_naive": spec.kv_bytes_per_token(),
        "experts": spec.moe.num_experts if spec.moe else 0,
        "experts_per_token": spec.moe.experts_per_token if spec.moe else 0,
        "max_position_embeddings": spec.max_position_embeddings,
    }


def run(args) -> int:
    rows = [describe(s) for s in (args.sources or reference_model_ids())]
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    header = f"{'model':18s} {'layers (full/slide/mla)':>24s} {'total B':>8s} {'active B':>9s} {'weights GiB':>11s} {'KV B/token':>11s}"
    print(header)
    for r in rows:
        layers = f"{r['layers']} ({r['full_layers']}/{r['sliding_layers']}/{r['mla_layers']})"
        print(
            f"{r['model']:18s} {layers:>24s} {r['params_total'] / 1e9:8.2f} {r['params_active'] / 1e9:9.2f} "
            f"{r['weight_bytes'] / GIB:11.2f} {r['kv_bytes_per_token_naive']:11d}"
        )
    print("KV B/token: naive sum over cache-owning layers, bf16, before TP, ignoring windows (see servebook.kv_cache).")
    return 0
