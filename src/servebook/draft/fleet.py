"""The draft chapter's batch-job estimate (section 6.22), reproduced to compare with the fleet model.

:func:`draft_estimate` is the draft's formula (prefill at an assumed MFU, decode reading total weights
/ 8 at an assumed MBU, no KV reads, no attention); :func:`compare_with_draft` runs the draft's five
scenarios through it and through :func:`servebook.perf.fleet.plan`, and says in one sentence why
the hours differ. Nothing but the comparison should call it. Units: hours, seconds, bytes, FLOP/s.
"""
from __future__ import annotations

from servebook.model_spec import ModelSpec
from servebook.perf.fleet import Deployment, FleetPlan, LengthDistribution, Speculation, Workload, plan
from servebook.perf.model import Coefficients
from servebook.perf.speculative import Drafter
from servebook.perf.work import decode_work


DRAFT_H100_BF16_FLOPS = 989.0e12
DRAFT_H100_HBM_BYTES_PER_S = 3.35e12
DRAFT_MFU_PREFILL = 0.45
DRAFT_MBU_DECODE = 0.70
DRAFT_TP = 8


def draft_estimate(requests: int, input_tokens: int, output_tokens: int, *, active_params: float,
                   total_params: float, gpus: int, batch: int, accept_rate: float = 0.0) -> dict:
    """The draft's formulas, kept only to compare with (hours; see errata 3-4 for what is wrong).

    Prefill: ``2 x active x tokens`` at 45 % of 989 TFLOP/s on every GPU; decode:
    total bf16 weights / 8 per step at 70 % of 3.35 TB/s, ``output / (1 + accept_rate)``
    steps, TP fixed at 8, no KV read, no attention term.
    """
    prefill_s = 2 * active_params * requests * input_tokens / (DRAFT_H100_BF16_FLOPS * DRAFT_MFU_PREFILL * gpus)
    replicas = max(1, gpus // DRAFT_TP)
    steps = requests * output_tokens / (1 + accept_rate) / batch / replicas
    decode_s = steps * total_params * 2 / DRAFT_TP / (DRAFT_H100_HBM_BYTES_PER_S * DRAFT_MBU_DECODE)
    total = prefill_s + decode_s
    return {"prefill_hours": prefill_s / 3600, "decode_hours": decode_s / 3600, "hours": total / 3600,
            "requests_per_s": requests / total}



#: The draft chapter's 6.22 scenarios: (label, reference model, active B, total B, gpus, batch, accept_rate).
DRAFT_SCENARIOS = (
    ("26B-A4B MoE, 8 GPU, batch 48", "gemma-4-26b-a4b", 4.0, 26.0, 8, 48, 0.0),
    ("26B-A4B MoE, 8 GPU, batch 48, spec", "gemma-4-26b-a4b", 4.0, 26.0, 8, 48, 1.6),
    ("31B dense, 8 GPU, batch 32", "gemma-4-31b", 31.0, 31.0, 8, 32, 0.0),
    ("31B dense, 8 GPU, batch 32, spec", "gemma-4-31b", 31.0, 31.0, 8, 32, 1.6),
    ("26B-A4B MoE, 64 GPU, batch 48", "gemma-4-26b-a4b", 4.0, 26.0, 64, 48, 0.0),
)
#: The draft's job: 10M requests x 12,000 tokens in / 3,000 out.
DRAFT_JOB = (10_000_000, 12_000, 3_000)
#: Drafts per step in the draft's speculative config (6.17: num_speculative_tokens 4).
DRAFT_SPEC_K = 4


#: How :func:`_explain_prefill` names the step-time terms.
_TERM_NAMES = {"allreduce_s": "TP all-reduce of their activations", "linear_s": "linear layers",
               "attention_s": "attention", "overhead_s": "per-step overheads",
               "step_mix_s": "decode-only steps beside steps carrying whole prompt chunks"}


def _explain_prefill(ours: FleetPlan, d: dict, decode_tokens: int) -> str:
    """Why our prefill hours differ from the draft's: what each step-time term adds for the prompt tokens."""
    terms = ours.prefill_step_terms_s
    added = sum(terms.values())
    to_hours = ours.steps_per_replica / 3600
    ranked = sorted(terms.items(), key=lambda kv: -kv[1])
    shown = [f"{_TERM_NAMES[t]} {v * 1e3:.2f} ms ({v * to_hours:.0f} h)" for t, v in ranked if v * to_hours >= 0.5]
    text = (f"prefill {ours.prefill_hours:.0f} h vs {d['prefill_hours']:.0f} h: the {ours.prefill_tokens_per_step:.0f} "
            f"prompt tokens a step carries beside {decode_tokens} decode tokens add {added * 1e3:.2f} ms to it — "
            + ", ".join(shown))
    if ours.step_bound == "memory":
        text += " (the linear layers stay bound by reading weights, so the prompt FLOPs cost little)"
    return text + (f"; the draft charges 2 x active parameters per prompt token at {DRAFT_MFU_PREFILL:.0%} of peak "
                   "and no communication")


def _explain(spec: ModelSpec, d: dict, ours: FleetPlan, batch: int, k: int, draft_total_params: float) -> str:
    """One sentence naming the largest causes of the gap between the draft's hours and ours."""
    ctx = ours.mean_running_context_tokens
    dec = decode_work(spec, batch, ctx, tp=ours.tp, query_tokens=k + 1)
    from servebook.perf.work import dense_weight_bytes_read, expert_weight_bytes_read, expected_distinct_experts
    weights = dense_weight_bytes_read(spec, ours.tp) + float(expert_weight_bytes_read(spec, dec.tokens, ours.tp))
    draft_bytes = draft_total_params * 2 / DRAFT_TP
    parts = [f"decode {ours.decode_hours:.0f} h vs {d['decode_hours']:.0f} h: a step reads "
             f"{weights / 1e9:.1f} GB of weights per GPU (draft: {draft_bytes / 1e9:.1f} GB) plus "
             f"{dec.kv_read_bytes / 1e9:.1f} GB of KV cache the draft ignores"]
    if spec.moe is not None:
        parts[-1] += (f", {float(expected_distinct_experts(spec, dec.tokens)):.0f} of {spec.moe.num_experts} experts "
                      f"touched per layer")
    if k:
        parts.append(f"verifying {k + 1} tokens per sequence makes each step {ours.step_s * 1e3:.1f} ms")
    eager = [n for n in ours.notes if "run eagerly" in n]
    if eager:
        parts.append(eager[0].split(":")[0] + ", so they run eagerly and pay the measured host-launch floor")
    parts.append(_explain_prefill(ours, d, batch * (k + 1)))
    return "; ".join(parts) + "."


def compare_with_draft(coeffs: Coefficients, gpu="h100-sxm", *, drafter: Drafter = Drafter(),
                       kv_budget_bytes_per_gpu: float | None = None,
                       cudagraph_max_tokens: int | None = 8192) -> list[dict]:
    """The draft's five 6.22 scenarios: its numbers (its formula) and ours, with the reason they differ.

    Ours uses the real Gemma 4 configs (reference ids ``gemma-4-26b-a4b`` and
    ``gemma-4-31b``), the draft's GPU count, batch and TP 8, KV reads, the
    attention term, and for "spec" ``k = 4`` drafts at the acceptance that yields
    the draft's 2.6 tokens per step.
    """
    from servebook.hf_config import load_model_spec
    from servebook.perf.speculative import acceptance_for_tokens_per_step

    requests, n_in, n_out = DRAFT_JOB
    work = Workload(requests, LengthDistribution.fixed(n_in), LengthDistribution.fixed(n_out))
    rows = []
    for label, model_id, active_b, total_b, gpus, batch, accept in DRAFT_SCENARIOS:
        spec = load_model_spec(model_id)
        d = draft_estimate(requests, n_in, n_out, active_params=active_b * 1e9, total_params=total_b * 1e9,
                           gpus=gpus, batch=batch, accept_rate=accept)
        spec_cfg = None
        k = 0
        if accept:
            k = DRAFT_SPEC_K
            spec_cfg = Speculation(k, acceptance_for_tokens_per_step(1 + accept, k), drafter)
        ours = plan(work, Deployment.of(spec, gpu=gpu, gpus=gpus, name=label, tp=DRAFT_TP, batch=batch, max_num_batched_tokens=8192,
                                     speculation=spec_cfg, kv_budget_bytes_per_gpu=kv_budget_bytes_per_gpu,
                                     cudagraph_max_tokens=cudagraph_max_tokens), coeffs)
        rows.append({"scenario": label, "model": model_id, "draft": d, "ours": ours.to_dict(),
                     "alpha": spec_cfg.alpha if spec_cfg else None,
                     "why": _explain(spec, d, ours, batch, k, total_b * 1e9)})
    return rows
