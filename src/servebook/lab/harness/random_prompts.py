"""Which prompts ``vllm bench serve --dataset-name random`` sends: their start ids, without vLLM.

vLLM 0.27.1's ``RandomDataset.sample`` (``vllm/benchmarks/datasets/datasets.py``, with
``get_sampling_params`` in ``datasets/utils.py``) seeds ``numpy.random.default_rng(seed)``, draws
``num_prompts`` input lengths, then ``num_prompts`` output lengths, then ``num_prompts`` offsets in
``[0, tokenizer.vocab_size)``, and builds prompt ``i`` as the allowed token ids (every id below the
vocabulary size that is not a special id) at positions ``(offset_i + i + 0, 1, 2, ...) mod
len(allowed)``. With no prefix and one input length, two prompts are the same text exactly when
their start positions ``(offset_i + i) mod len(allowed)`` are equal, and prompts with different
starts differ in their first token, so they share no KV block in the prefix cache.

:func:`prompt_starts` repeats those draws; :func:`repeated_starts` says which starts two loads (for
example the ``vllm bench serve`` clients of one lab, each with its own seed) would share.
``tests/engine/test_random_prompts.py`` checks the starts against vLLM's own ``RandomDataset``.
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable

import numpy as np

from servebook.lab.errors import LabError


def prompt_starts(seed: int, num_prompts: int, *, vocab_size: int, num_special_ids: int, input_len: int,
                  output_len: int, range_ratio: float = 0.0, num_special_tokens_to_add: int = 1) -> list[int]:
    """Start position (index into the allowed ids) of each prompt of one ``vllm bench serve`` run.

    Args:
        seed: ``--seed`` of the run.
        num_prompts: ``--num-prompts`` of the run.
        vocab_size: the tokenizer's ``vocab_size`` (the offsets are drawn below it).
        num_special_ids: how many ids below ``vocab_size`` are special (never drawn).
        input_len / output_len: ``--random-input-len`` / ``--random-output-len``, tokens.
        range_ratio: ``--random-range-ratio`` (lengths uniform in ``len * (1 -+ ratio)``).
        num_special_tokens_to_add: tokens the tokenizer adds to a prompt (a BOS: 1); vLLM takes
            them off the input length before it draws.
    """
    if num_prompts < 1 or not 0 <= range_ratio < 1 or vocab_size <= num_special_ids:
        raise LabError(f"num_prompts {num_prompts}, range_ratio {range_ratio}, vocab_size {vocab_size} with "
                       f"{num_special_ids} special ids: use at least one prompt, a ratio in [0, 1) and a "
                       "vocabulary larger than its special ids")
    rng = np.random.default_rng(seed)
    real_input = max(0, input_len - num_special_tokens_to_add)
    rng.integers(math.floor(real_input * (1 - range_ratio)), math.ceil(real_input * (1 + range_ratio)) + 1,
                 size=num_prompts)
    out_low = max(math.floor(output_len * (1 - range_ratio)), 1)
    rng.integers(out_low, max(math.ceil(output_len * (1 + range_ratio)), 1) + 1, size=num_prompts)
    offsets = rng.integers(0, vocab_size, size=num_prompts)
    allowed = vocab_size - num_special_ids
    return [int((offset + i) % allowed) for i, offset in enumerate(offsets)]


def repeated_starts(loads: Iterable[tuple[int, int]], **dataset) -> dict[int, int]:
    """Start positions sent more than once over several runs, with how often (empty: all distinct).

    ``loads`` holds one ``(seed, num_prompts)`` per ``vllm bench serve`` run; ``dataset`` the
    keyword arguments of :func:`prompt_starts` that the runs share.
    """
    counts = Counter(s for seed, n in loads for s in prompt_starts(seed, n, **dataset))
    return {start: k for start, k in counts.items() if k > 1}
