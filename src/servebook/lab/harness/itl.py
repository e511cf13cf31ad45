"""Per-token arrival times of streaming requests, and the inter-token latency (ITL) they imply.

The workload of Lab 5: ``decode_requests`` streaming requests start decoding, then one long
prompt arrives. :func:`run_long_prompt_among_decodes` sends them to a
:class:`~servebook.lab.harness.server.VllmServer` (``/v1/completions`` with ``stream: true`` and
``return_token_ids: true``, so every chunk says how many tokens it carries) and records, per
request, when it was sent and when each chunk arrived (``time.monotonic()``, seconds; the
machine-wide monotonic clock, the same one the engine's step log uses). :func:`spike_summary`
turns that into the long prompt's time to first token (TTFT) and the decodes' ITL before and
after it arrived.

Only the standard library is used for HTTP (one thread per request), so the book's
environment needs nothing more.
"""
from __future__ import annotations

import http.client
import json
import random
import statistics
import threading
import time
from dataclasses import asdict, dataclass, field
from urllib.parse import urlparse

from servebook.lab.errors import LabError


@dataclass
class StreamRecord:
    """One streaming request as the client saw it (times are ``time.monotonic()`` seconds)."""

    name: str
    prompt_tokens: int
    max_tokens: int
    send_s: float | None = None
    arrivals_s: list[float] = field(default_factory=list)
    tokens_per_chunk: list[int] = field(default_factory=list)
    error: str | None = None

    @property
    def tokens(self) -> int:
        """Output tokens received (tokens)."""
        return sum(self.tokens_per_chunk)

    @property
    def ttft_s(self) -> float | None:
        """Seconds from sending the request to its first token chunk."""
        if self.send_s is None or not self.arrivals_s:
            return None
        return self.arrivals_s[0] - self.send_s

    def to_dict(self) -> dict:
        return asdict(self)


def parse_sse_line(line: bytes | str) -> dict | str | None:
    """One line of a server-sent-events stream: the JSON of a ``data:`` line, ``"done"`` for
    ``data: [DONE]``, None for anything else (blank lines, comments)."""
    text = line.decode() if isinstance(line, bytes) else line
    text = text.strip()
    if not text.startswith("data:"):
        return None
    payload = text[len("data:"):].strip()
    if payload == "[DONE]":
        return "done"
    return json.loads(payload)


def chunk_token_count(event: dict) -> int:
    """Output tokens carried by one streamed completion chunk (``return_token_ids`` must be on).

    Raises :class:`LabError` when the chunk carries an error or no ``token_ids`` field (the
    server ignored ``return_token_ids``: an older vLLM; token counts would be guesses).
    """
    if "error" in event:
        raise LabError(f"the server streamed an error: {event['error']}")
    choices = event.get("choices") or []
    if not choices:
        return 0  # a usage-only chunk
    ids = choices[0].get("token_ids")
    if ids is None:
        raise LabError("streamed chunk has no token_ids: this vLLM ignores return_token_ids; "
                       "use vLLM >= 0.10.2 (the lab pins 0.27.1)")
    return len(ids)


def stream_completion(base_url: str, model: str, prompt_token_ids: list[int], record: StreamRecord, *,
                      timeout_s: float = 600.0) -> StreamRecord:
    """Send one streaming ``/v1/completions`` request and fill ``record`` as chunks arrive.

    ``ignore_eos`` and greedy sampling make every request produce exactly ``record.max_tokens``.
    Errors are stored in ``record.error`` (the thread running this must not die silently).
    """
    url = urlparse(base_url)
    body = json.dumps({"model": model, "prompt": prompt_token_ids, "max_tokens": record.max_tokens,
                       "ignore_eos": True, "temperature": 0, "stream": True, "return_token_ids": True})
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=timeout_s)
    try:
        record.send_s = time.monotonic()
        conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        if response.status != 200:
            record.error = f"HTTP {response.status}: {response.read().decode(errors='replace')[:500]}"
            return record
        while True:
            line = response.readline()
            if not line:
                break
            event = parse_sse_line(line)
            if event is None:
                continue
            if event == "done":
                break
            n = chunk_token_count(event)
            if n:
                record.arrivals_s.append(time.monotonic())
                record.tokens_per_chunk.append(n)
    except Exception as exc:  # noqa: BLE001  (reported through the record, checked by the caller)
        record.error = f"{type(exc).__name__}: {exc}"
    finally:
        conn.close()
    return record


def random_prompt(tokens: int, rng: random.Random, vocab_size: int) -> list[int]:
    """``tokens`` random token ids in ``[3, vocab_size)`` (no BOS/EOS, no shared prefixes)."""
    if tokens < 1:
        raise LabError(f"a prompt needs at least 1 token, got {tokens}")
    return [rng.randrange(3, vocab_size) for _ in range(tokens)]


class _NoOverlap(LabError):
    """A decode ended before the long prompt's first token: its prefill did not run among the decodes."""


def run_long_prompt_among_decodes(server, *, decode_requests: int, decode_prompt_tokens: int,
                                  decode_output_tokens: int, long_prompt_tokens: int, long_output_tokens: int = 2,
                                  warm_tokens: int = 4, vocab_size: int = 512, seed: int = 0,
                                  timeout_s: float = 600.0, attempts: int = 3) -> dict:
    """Start ``decode_requests`` streaming decodes; once each has ``warm_tokens`` tokens, send the long prompt.

    Returns ``{"decodes": [StreamRecord dict, ...], "long": StreamRecord dict,
    "long_send_s": s, "wall_s": s, "attempt": n}``. The run counts only when every decode was
    still streaming when the long prompt's first token came back (its prefill ran among them); on
    a loaded machine that can fail, and the run is repeated with new prompts, ``attempts`` times
    at most. Raises :class:`LabError` when a request failed or was cut short, or when no attempt
    overlapped.
    """
    for attempt in range(1, attempts + 1):
        try:
            run = _long_prompt_run(server, decode_requests=decode_requests, decode_prompt_tokens=decode_prompt_tokens,
                                   decode_output_tokens=decode_output_tokens, long_prompt_tokens=long_prompt_tokens,
                                   long_output_tokens=long_output_tokens, warm_tokens=warm_tokens,
                                   vocab_size=vocab_size, seed=seed + 1000 * (attempt - 1), timeout_s=timeout_s)
        except _NoOverlap:
            if attempt == attempts:
                raise
            continue
        return {**run, "attempt": attempt}
    raise LabError(f"attempts must be >= 1, got {attempts}")


def _long_prompt_run(server, *, decode_requests: int, decode_prompt_tokens: int, decode_output_tokens: int,
                     long_prompt_tokens: int, long_output_tokens: int, warm_tokens: int, vocab_size: int,
                     seed: int, timeout_s: float) -> dict:
    if decode_output_tokens <= warm_tokens:
        raise LabError(f"decode_output_tokens ({decode_output_tokens}) must exceed warm_tokens ({warm_tokens}) "
                       "so that the decodes are still running when the long prompt arrives")
    rng = random.Random(seed)
    decodes = [StreamRecord(f"decode-{i}", decode_prompt_tokens, decode_output_tokens) for i in range(decode_requests)]
    long = StreamRecord("long", long_prompt_tokens, long_output_tokens)
    prompts = [random_prompt(decode_prompt_tokens, rng, vocab_size) for _ in decodes]
    long_prompt = random_prompt(long_prompt_tokens, rng, vocab_size)

    def start(record: StreamRecord, prompt: list[int]) -> threading.Thread:
        thread = threading.Thread(target=stream_completion, args=(server.base_url, server.model, prompt, record),
                                  kwargs={"timeout_s": timeout_s}, daemon=True)
        thread.start()
        return thread

    t0 = time.monotonic()
    threads = [start(r, p) for r, p in zip(decodes, prompts)]
    while not all(r.tokens >= warm_tokens or r.error for r in decodes):
        if time.monotonic() - t0 > timeout_s:
            raise LabError(f"the decodes did not reach {warm_tokens} tokens within {timeout_s:.0f} s")
        time.sleep(0.001)
    threads.append(start(long, long_prompt))
    for thread in threads:
        thread.join(timeout=max(1.0, timeout_s - (time.monotonic() - t0)))
    for r in [*decodes, long]:
        if r.error or r.tokens != r.max_tokens:
            raise LabError(f"request {r.name} {'failed: ' + r.error if r.error else 'was cut short'} "
                           f"({r.tokens} of {r.max_tokens} tokens); read the server's log (server.log)")
    if any(d.arrivals_s[-1] < long.arrivals_s[0] for d in decodes):
        raise _NoOverlap(f"a decode finished before the long prompt's first token ({attempts_hint(decode_output_tokens)})")
    return {"decodes": [d.to_dict() for d in decodes], "long": long.to_dict(), "long_send_s": long.send_s,
            "wall_s": time.monotonic() - t0}


def attempts_hint(decode_output_tokens: int) -> str:
    return f"its prefill did not run among the decodes; raise decode_output_tokens above {decode_output_tokens}"


def inter_token_gaps(arrivals_s: list[float]) -> list[tuple[float, float]]:
    """``(arrival of the later chunk, gap)`` for each pair of consecutive chunks (seconds)."""
    return [(b, b - a) for a, b in zip(arrivals_s, arrivals_s[1:])]


def spike_summary(run: dict) -> dict:
    """TTFT of the long prompt and the decodes' ITL around its arrival (seconds).

    * ``baseline_itl_s`` — median gap between decode chunks before the long prompt was sent, counting
      only gaps that began once every decode had its first token (earlier gaps include steps that
      prefilled the other decodes' prompts: on the H200, 15 ms median at a 256-token budget against
      5.8 ms once all prompts were in);
    * ``worst_itl_s`` — the largest gap of a decode chunk that arrived after it was sent;
    * ``prefill_window_itl_s`` — mean gap of decode chunks arriving while the long prompt waited for
      its first token (its send to its first chunk);
    * ``decode_chunks_during_prefill`` — per decode, chunks that arrived in that window (each engine
      step gives a running decode one token, so this counts the steps the prompt's prefill took, give or
      take the step in flight when it was sent).
    """
    send, long = run["long_send_s"], run["long"]
    first = long["arrivals_s"][0]
    settled = max(d["arrivals_s"][0] for d in run["decodes"])   # every decode's prompt is prefilled
    before, after, window, during = [], [], [], []
    for d in run["decodes"]:
        for t, gap in inter_token_gaps(d["arrivals_s"]):
            if t >= send:
                after.append(gap)
            elif t - gap >= settled:
                before.append(gap)
            if send < t <= first:
                window.append(gap)
        during.append(sum(1 for t in d["arrivals_s"] if send < t < first))
    if not before or not after:
        raise LabError("no decode gaps before or after the long prompt's arrival: raise warm_tokens "
                       "or decode_output_tokens")
    return {
        "ttft_s": first - send,
        "baseline_itl_s": statistics.median(before),
        "worst_itl_s": max(after),
        "prefill_window_itl_s": statistics.fmean(window) if window else None,
        "decode_chunks_during_prefill": during,
    }


def itl_timeline(run: dict) -> list[tuple[float, float]]:
    """Every decode gap as ``(arrival relative to the long prompt's send, gap)``, seconds, sorted by time."""
    send = run["long_send_s"]
    points = [(t - send, gap) for d in run["decodes"] for t, gap in inter_token_gaps(d["arrivals_s"])]
    return sorted(points)
