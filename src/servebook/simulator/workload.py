"""Requests the simulator serves: lengths, arrival times, shared prefixes.

A :class:`RequestSpec` is everything the scheduler needs to know about a request
without its text: how many prompt tokens it has, how many tokens it will generate
(``output_tokens``, as with ``ignore_eos=True`` and ``max_tokens``), when it
arrives, and which leading part of its prompt (``prefix_tokens`` tokens) it shares
with other requests that carry the same ``prefix_id`` (a system prompt, a RAG
template). Token *content* never matters to the scheduler except through prefix
caching, so sharing is described by that pair instead of token ids.

:func:`synthetic_workload` draws a reproducible workload: Poisson arrivals and
log-normal prompt/output lengths. The preset ``"sharegpt-like"`` has means of
about 160 prompt and 340 output tokens, the size of the ShareGPT conversations
used in the PagedAttention paper (Kwon et al., SOSP 2023, arXiv 2309.06180,
section 6.1); ``"alpaca-like"`` about 20 and 60. They are stand-ins with the
right scale and spread, not the datasets.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from servebook.errors import ServebookError
from servebook.reductions import require_numpy
from servebook.simulator.config import TOY_MAX_MODEL_LEN


@dataclass(frozen=True)
class RequestSpec:
    """One request as the scheduler sees it.

    Attributes:
        request_id: unique name.
        prompt_tokens: prompt length in tokens (>= 1).
        output_tokens: tokens the request generates before it finishes (>= 1).
        arrival_s: arrival time in seconds from the start of the run (>= 0).
        prefix_id: name of a prompt prefix shared with other requests, or None.
        prefix_tokens: how many leading prompt tokens are that shared prefix.
    """

    request_id: str
    prompt_tokens: int
    output_tokens: int
    arrival_s: float = 0.0
    prefix_id: str | None = None
    prefix_tokens: int = 0

    def __post_init__(self) -> None:
        if self.prompt_tokens < 1:
            raise ServebookError(
                f"request {self.request_id}: prompt_tokens is {self.prompt_tokens}; give at least 1 token"
            )
        if self.output_tokens < 1:
            raise ServebookError(
                f"request {self.request_id}: output_tokens is {self.output_tokens}; give at least 1 token"
            )
        if self.arrival_s < 0 or not math.isfinite(self.arrival_s):
            raise ServebookError(
                f"request {self.request_id}: arrival_s is {self.arrival_s}; give a time >= 0 seconds"
            )
        if not 0 <= self.prefix_tokens <= self.prompt_tokens:
            raise ServebookError(
                f"request {self.request_id}: prefix_tokens ({self.prefix_tokens}) must lie between 0 "
                f"and prompt_tokens ({self.prompt_tokens})"
            )
        if self.prefix_tokens and self.prefix_id is None:
            raise ServebookError(
                f"request {self.request_id}: prefix_tokens is set but prefix_id is None; name the prefix"
            )

    @property
    def total_tokens(self) -> int:
        """Prompt plus output tokens: the most KV slots the request ever needs."""
        return self.prompt_tokens + self.output_tokens


#: Log-normal length presets: (median prompt, sigma prompt, median output, sigma output), tokens.
#: Means are median * exp(sigma**2 / 2): sharegpt-like ~160 / ~340, alpaca-like ~20 / ~60.
LENGTH_PRESETS: dict[str, tuple[float, float, float, float]] = {
    "sharegpt-like": (100.0, 1.0, 210.0, 1.0),
    "alpaca-like": (15.0, 0.75, 45.0, 0.75),
    "long-context": (8000.0, 0.5, 600.0, 0.6),
}


def lognormal_lengths(input_mean: float, input_cv: float, output_mean: float, output_cv: float
                      ) -> tuple[float, float, float, float]:
    """``(prompt median, prompt sigma, output median, output sigma)`` of lognormal lengths with the given
    means (tokens) and coefficients of variation (std/mean; 0 = every request the same length): the
    form of :data:`LENGTH_PRESETS`, the same lengths ``servebook fleet`` takes."""
    out = []
    for name, m, cv in (("input", input_mean, input_cv), ("output", output_mean, output_cv)):
        if not (math.isfinite(m) and m >= 1):
            raise ServebookError(f"--{name}-tokens {m:g} is not allowed; give a mean length of at least 1 token")
        if not (math.isfinite(cv) and cv >= 0):
            raise ServebookError(f"--{name}-cv {cv:g} is not allowed; give a coefficient of variation >= 0 "
                                 "(0 = every request the same length)")
        sigma = math.sqrt(math.log1p(cv * cv))
        out += [m / math.exp(sigma * sigma / 2), sigma]
    return tuple(out)


@dataclass(frozen=True)
class Truncation:
    """What clipping a drawn workload to ``max_model_len`` did.

    A drawn prompt longer than ``max_model_len - 1`` is cut to ``max_model_len - 1``
    tokens, and an output is shortened so that prompt + output <= ``max_model_len``.

    Attributes:
        requests: requests whose prompt or output was cut.
        prompts: prompts cut to ``max_model_len - 1`` tokens.
        outputs: outputs shortened to fit ``max_model_len``.
        longest_drawn_tokens: the longest drawn prompt + output, before clipping.
    """

    max_model_len: int
    requests: int
    prompts: int
    outputs: int
    longest_drawn_tokens: int

    @property
    def prompt_cap_tokens(self) -> int:
        """The length a cut prompt is cut to."""
        return self.max_model_len - 1

    def to_dict(self) -> dict:
        return {"requests": self.requests, "prompts": self.prompts, "prompt_cap_tokens": self.prompt_cap_tokens,
                "outputs": self.outputs, "max_model_len": self.max_model_len,
                "longest_drawn_tokens": self.longest_drawn_tokens}

    def describe(self, total: int) -> str:
        """One line for a person, e.g. '10 of 10 requests cut: ...'; empty when nothing was cut."""
        if not self.requests:
            return ""
        return (f"{self.requests} of {total} requests cut to fit max_model_len {self.max_model_len} "
                f"(longest drawn {self.longest_drawn_tokens:,} tokens): {self.prompts} prompts cut to "
                f"{self.prompt_cap_tokens} tokens, {self.outputs} outputs shortened so prompt + output <= "
                f"{self.max_model_len}; raise --max-model-len to keep the length distribution")


def synthetic_workload(num_requests: int, **options) -> list[RequestSpec]:
    """A reproducible list of requests: those of :func:`synthetic_workload_with_truncation`.

    Same arguments (``num_requests``; keywords ``arrival_rate_per_s``, ``lengths``, ``max_model_len``,
    ``shared_prefix_tokens``, ``seed``), without its report of what ``max_model_len`` cut.
    """
    requests, _ = synthetic_workload_with_truncation(num_requests, **options)
    return requests


def synthetic_workload_with_truncation(
    num_requests: int,
    *,
    arrival_rate_per_s: float = math.inf,
    lengths: str | tuple[float, float, float, float] = "sharegpt-like",
    max_model_len: int = TOY_MAX_MODEL_LEN,
    shared_prefix_tokens: int = 0,
    seed: int = 0,
) -> tuple[list[RequestSpec], Truncation]:
    """A reproducible list of requests, and a :class:`Truncation` of what ``max_model_len`` cut.

    Args:
        num_requests: how many requests (>= 1).
        arrival_rate_per_s: mean Poisson arrival rate in requests per second;
            ``math.inf`` puts every arrival at t = 0 (an offline batch).
        lengths: a key of :data:`LENGTH_PRESETS`, or such a tuple (:func:`lognormal_lengths`).
        max_model_len: prompt + output is clipped to this many tokens, as a
            server with ``--max-model-len`` would refuse or cut longer ones.
        shared_prefix_tokens: if > 0, every prompt starts with the same prefix of
            this many tokens (``prefix_id="system"``); prompts are lengthened to
            hold it.
        seed: random seed.
    """
    if num_requests < 1:
        raise ServebookError(f"num_requests is {num_requests}; ask for at least 1 request")
    if isinstance(lengths, tuple) and len(lengths) == 4:
        preset = lengths
    elif lengths not in LENGTH_PRESETS:
        raise ServebookError(
            f"unknown length distribution {lengths!r}; choose one of {sorted(LENGTH_PRESETS)}"
        )
    else:
        preset = LENGTH_PRESETS[lengths]
    if not arrival_rate_per_s > 0:
        raise ServebookError(f"arrival_rate_per_s is {arrival_rate_per_s}; give a rate > 0 requests/s")
    if shared_prefix_tokens < 0 or shared_prefix_tokens + 2 > max_model_len:
        raise ServebookError(
            f"shared_prefix_tokens ({shared_prefix_tokens}) must be >= 0 and leave room in "
            f"max_model_len ({max_model_len}) for at least one more prompt and one output token"
        )
    np = require_numpy("synthetic_workload (numpy's random generator draws the lengths and arrivals)")
    rng = np.random.default_rng(seed)
    p_med, p_sig, o_med, o_sig = preset
    prompts = np.maximum(1, np.rint(rng.lognormal(math.log(p_med), p_sig, num_requests))).astype(int)
    outputs = np.maximum(1, np.rint(rng.lognormal(math.log(o_med), o_sig, num_requests))).astype(int)
    if math.isinf(arrival_rate_per_s):
        arrivals = np.zeros(num_requests)
    else:
        arrivals = np.cumsum(rng.exponential(1.0 / arrival_rate_per_s, num_requests))
        arrivals -= arrivals[0]
    requests = []
    cut_prompts = cut_outputs = cut_requests = longest = 0
    for i in range(num_requests):
        drawn_prompt = int(prompts[i]) + shared_prefix_tokens
        prompt = min(drawn_prompt, max_model_len - 1)
        output = min(int(outputs[i]), max_model_len - prompt)
        cut_prompts += prompt < drawn_prompt
        cut_outputs += output < int(outputs[i])
        cut_requests += prompt < drawn_prompt or output < int(outputs[i])
        longest = max(longest, drawn_prompt + int(outputs[i]))
        requests.append(
            RequestSpec(
                request_id=f"r{i}",
                prompt_tokens=prompt,
                output_tokens=output,
                arrival_s=float(arrivals[i]),
                prefix_id="system" if shared_prefix_tokens else None,
                prefix_tokens=shared_prefix_tokens,
            )
        )
    return requests, Truncation(max_model_len=max_model_len, requests=cut_requests, prompts=cut_prompts,
                                outputs=cut_outputs, longest_drawn_tokens=longest)
