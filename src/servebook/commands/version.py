"""``servebook versions``: the library version and the vLLM releases it describes."""
from __future__ import annotations

import json

from servebook._version import __version__
from servebook.vllm_rules.release import GPU_LAB_VLLM, PINNED_VLLM


def register(sub) -> None:
    p = sub.add_parser("versions", help="print the library version and the pinned vLLM releases")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    info = {"servebook": __version__, "pinned_vllm": PINNED_VLLM, "gpu_lab_vllm": GPU_LAB_VLLM}
    if args.json:
        print(json.dumps(info))
    else:
        for key, value in info.items():
            print(f"{key:14s}{value}")
    return 0
