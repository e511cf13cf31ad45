"""Lab 2, paged + continuous batching against static batching, on the same requests.

``labs/l2_paged_continuous.md`` prints :func:`l2_summary` on what it is about to save; the results
page (``labs/results_l2.md``) and section 6.3 call it on the recorded file. :func:`static_useful_fraction`
is the prediction, :func:`change_quantities` what a re-recording is compared on
(:mod:`servebook.lab.recordings.rerecordings`), :func:`plot_l2` the figure.

Throughputs are output tokens per second, latencies seconds unless the key says ``_ms``.
"""
from __future__ import annotations

import statistics

from servebook.lab.recordings.recorded import figure_title


def static_useful_fraction(output_len: int, range_ratio: float, batch_size: int) -> float:
    """Expected share of static batching's decode slots that produce a useful token.

    Output lengths uniform on ``[(1-r)L, (1+r)L]``; a batch of ``B`` decodes until its longest
    request ends, and the expected maximum of ``B`` uniform draws on ``[lo, hi]`` is
    ``lo + (hi - lo) B / (B + 1)``; the mean length is ``L``.
    """
    lo, hi = int(output_len * (1 - range_ratio)), int(output_len * (1 + range_ratio))
    return output_len / (lo + (hi - lo) * batch_size / (batch_size + 1))


def _percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def l2_summary(measurements: dict) -> dict:
    """Lab 2's comparison of vLLM and the HF static-batching baseline on the same requests.

    Args:
        measurements: with ``vllm.requests`` (``output_len``, ``start_s``, ``latency_s``),
            ``static_baseline`` (``requests`` with ``latency_s``, ``output_throughput``,
            ``computed_tokens``, ``batch_size``).

    Returns:
        ``rows`` (one per system), ``vllm_output_throughput`` (output tokens / time from the first
        request's start to the last one's end, tokens/s), ``static_output_throughput``,
        ``speedup`` (their ratio), ``useful_fraction`` (output tokens / tokens the static
        batches computed).
    """
    vllm_reqs, static = measurements["vllm"]["requests"], measurements["static_baseline"]
    output_tokens = sum(q["output_len"] for q in vllm_reqs)
    v_lat = [q["latency_s"] for q in vllm_reqs]
    h_lat = [q["latency_s"] for q in static["requests"]]
    v_tput = output_tokens / max(q["start_s"] + q["latency_s"] for q in vllm_reqs)
    h_tput = static["output_throughput"]
    rows = [
        {"system": "vLLM (paged, continuous)", "output tok/s": v_tput, "mean latency s": statistics.mean(v_lat),
         "p50 s": _percentile(v_lat, 0.5), "p99 s": _percentile(v_lat, 0.99), "computed tokens": output_tokens},
        {"system": f"HF static, batch {static['batch_size']}", "output tok/s": h_tput,
         "mean latency s": statistics.mean(h_lat), "p50 s": _percentile(h_lat, 0.5),
         "p99 s": _percentile(h_lat, 0.99), "computed tokens": static["computed_tokens"]},
    ]
    return {"rows": rows, "vllm_output_throughput": v_tput, "static_output_throughput": h_tput,
            "speedup": v_tput / h_tput, "useful_fraction": output_tokens / static["computed_tokens"]}


def change_quantities(m: dict) -> dict[str, float]:
    """The quantities :func:`servebook.lab.recordings.rerecordings.recording_changes` compares for Lab 2, by name."""
    s = l2_summary(m)
    return {"vLLM output tok/s": s["vllm_output_throughput"], "HF static output tok/s": s["static_output_throughput"],
            "vLLM / static output throughput": s["speedup"],
            "vLLM mean inter-token latency ms (clients)": m["vllm"]["summary"]["mean_itl_ms"]}


def plot_l2(measurements: dict, doc: dict | None = None):
    """Latency CDF of vLLM and the static baseline (left) and their output throughput (right)."""
    import matplotlib.pyplot as plt

    summary = l2_summary(measurements)
    static = measurements["static_baseline"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.6), gridspec_kw={"width_ratios": [2, 1]})
    for label, reqs in (("vLLM", measurements["vllm"]["requests"]),
                        (f"HF static (batch {static['batch_size']})", static["requests"])):
        lat = sorted(q["latency_s"] for q in reqs)
        a.step(lat, [(i + 1) / len(lat) for i in range(len(lat))], where="post", label=label)
    a.set_xlabel("request latency, s (all requests queued at t=0)")
    a.set_ylabel("share of requests done (CDF)")
    a.legend(fontsize=8)
    b.bar(["vLLM", "HF static"], [summary["vllm_output_throughput"], summary["static_output_throughput"]],
          color=["C0", "C1"])
    b.set_xlabel("system (same requests)")
    b.set_ylabel("output throughput, tokens/s")
    fig.suptitle(figure_title(doc, "Continuous batching vs static batching"), fontsize=9)
    fig.tight_layout()
    return fig
