"""The claims the chapter pages (book/*.md) make about their numbers, checked here instead of on the page.

A chapter page computes its numbers in hidden cells with short calls to ``servebook`` and glues
them into the prose, so a glued number follows the code. What a glued number cannot guard is a
sentence that *compares* numbers or bounds one ("only 20% longer", "more than twice", "inside
the range Kwon et al. measured", "within 15% of the model"). Those checks used to be ``assert``
lines in the pages' hidden cells; they live here, recomputed through the library with the same
arguments as the page, and each message names the page and the sentence it guards, so a library
change or a new recording that moves a number past what a sentence states fails this file.
"""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from servebook import make_plan
from servebook.hardware import get_gpu
from servebook.hf_config import load_model_spec
from servebook.kv_cache import default_block_size, kv_cache_layout
from servebook.records import StepTimes, step_times
from servebook.simulator import RequestSpec, SchedulerConfig, simulate, synthetic_workload

GIB = 2**30
BOOK = Path(__file__).resolve().parents[1] / "book"
_CELL = re.compile(r"^```\{code-cell\}[^\n]*\n(.*?)^```", re.S | re.M)
#: Pages whose hidden cells still assert, each with the reason; a listed page that no longer asserts fails
#: below, so the list only shrinks.
PAGES_STILL_ASSERTING: dict[str, str] = {}


def _asserts(text: str) -> list[int]:
    """Page line of every ``assert`` statement in the page's ``{code-cell}`` blocks (options and magics blanked)."""
    found = []
    for m in _CELL.finditer(text):
        first = text.count("\n", 0, m.start(1)) + 1
        source = "\n".join("" if ln.lstrip().startswith((":", "%", "!")) else ln for ln in m.group(1).split("\n"))
        found += [first + n.lineno - 1 for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Assert)]
    return found


@pytest.mark.parametrize("page", sorted(BOOK.glob("*.md")), ids=lambda p: p.name)
def test_chapter_pages_compute_and_glue_and_leave_the_checks_to_this_file(page):
    found = _asserts(page.read_text())
    if page.name in PAGES_STILL_ASSERTING:
        assert found, f"book/{page.name} no longer asserts: remove it from PAGES_STILL_ASSERTING"
    else:
        assert not found, (f"book/{page.name}: assert at lines {found}; a page computes and glues, the check of "
                           "what its sentence claims goes in tests/test_page_claims.py (recompute the value there)")


def test_the_page_assert_check_sees_asserts_in_hidden_cells_only_in_code_cells():
    page = ("# A page\n\n```python\nassert False  # a plain block is not executed\n```\n\n"
            "```{code-cell} ipython3\n:tags: [remove-cell]\n%matplotlib inline\nx = 1\nassert x == 1\n```\n")
    assert _asserts(page) == [page.splitlines().index("assert x == 1") + 1]
    assert _asserts(page.replace("assert x == 1", "glue('x', x)")) == []


#: Words about how the book is built and checked, not about serving: they belong in a page's "Run it yourself"
#: paragraph (or admonition), on lab and results pages, or in the appendix, not in a chapter page's argument.
_WORKSHOP = re.compile(r"\bCI\b|\bdrift tests?\b|\bengine tests?\b|\btests/|\bsrc/servebook\b|\brepository\b|\blent\b",
                       re.I)
_FENCE = re.compile(r"^(`{3,}|:{3,})\s*(\{[^}]*\})?\s*(.*)$")


def _workshop_talk(text: str) -> list[tuple[int, str]]:
    """``(line, text)`` of each chapter-prose line naming CI, tests, the repository or a lent GPU, outside code
    blocks and cells and outside "Run it yourself" paragraphs and admonitions."""
    found, fences, skip_paragraph = [], [], False
    for n, line in enumerate(text.split("\n"), 1):
        m = _FENCE.match(line.strip())
        if m:
            if fences and m.group(1) == fences[-1][0] and not m.group(2) and not m.group(3):
                fences.pop()
                continue
            directive, title = (m.group(2) or ""), m.group(3)
            code = not directive or directive in ("{code-cell}", "{code-block}", "{code}")
            fences.append((m.group(1), code or "run it yourself" in title.lower()))
            continue
        if any(hidden for _, hidden in fences):
            continue
        if not line.strip():
            skip_paragraph = False
            continue
        if line.lstrip().lower().startswith("**run it yourself"):
            skip_paragraph = True
        if not skip_paragraph and _WORKSHOP.search(line):
            found.append((n, line.strip()))
    return found


@pytest.mark.parametrize("page", sorted(BOOK.glob("06-*.md")), ids=lambda p: p.name)
def test_chapter_prose_speaks_of_serving_not_of_the_books_workshop(page):
    found = _workshop_talk(page.read_text())
    assert not found, (f"book/{page.name}: chapter prose names CI, tests, the repository or a lent GPU at "
                       f"{found}; say what was checked ('checked against vLLM 0.32.0's source') or move the "
                       "remark to the page's 'Run it yourself' paragraph, a lab page or the appendix")


def test_the_workshop_check_reads_prose_only():
    page = ("# x\n\nThe drift test checks it.\n\n```{code-cell} ipython3\n# the drift test parses this\n```\n\n"
            "```{admonition} Run it yourself\nSee tests/engine.\n```\n\n```{admonition} Note\nCI ran it.\n```\n\n"
            "**Run it yourself.** `pytest tests/engine`\nin the repository.\n\nOn the lent GPU.\n")
    assert [n for n, _ in _workshop_talk(page)] == [3, 14, 20]


@pytest.fixture(scope="module")
def qwen32_h200() -> StepTimes:
    """labs/results/step_timing/qwen3-32b.json: the H200 step timings pages 6.1, 6.4, 6.10, 6.11 quote."""
    return step_times("qwen3-32b")


def test_step_times_reads_decode_and_prefill_and_names_a_missing_file(tmp_path):
    (tmp_path / "step_timing").mkdir()
    (tmp_path / "step_timing" / "m.json").write_text(
        '{"vllm_version": "0.26.0", "gpu": {"name": "NVIDIA H200", "count": 2}, "cases": ['
        '{"engine_args": {"tensor_parallel_size": 2}, "result": {'
        '"decode": [{"batch": 4, "prompt_tokens": 512, "step_s": 0.02}],'
        '"prefill": [{"tokens": 2048, "time_s": 0.1}]}}]}')
    t = step_times("m", directory=tmp_path)
    assert (t.decode_s, t.prefill_s, t.vllm_version, t.gpu_name, t.gpu_count, t.engine_args) == (
        {(4, 512): 0.02}, {2048: 0.1}, "0.26.0", "NVIDIA H200", 2, {"tensor_parallel_size": 2})
    with pytest.raises(FileNotFoundError, match=r"step_timing/absent\.json"):
        step_times("absent", directory=tmp_path)


# ---- 6.1 Why a serving engine at all --------------------------------------------------------------------
EIGHT_OUTPUTS = [40, 300, 60, 250, 30, 280, 50, 200]  # 6.1 and 6.3: eight requests, two batch slots


def _eight_requests(policy: str):
    reqs = [RequestSpec(f"r{i}", 200, n) for i, n in enumerate(EIGHT_OUTPUTS)]
    return simulate(reqs, SchedulerConfig(policy=policy, num_blocks=256, block_size=16, max_num_seqs=2,
                                          max_model_len=1024))


def test_6_1_measured_on_one_h200_with_vllm_0_26_and_no_faster_than_one_weight_read(qwen32_h200):
    t = qwen32_h200
    assert (t.vllm_version, t.gpu_name) == ("0.26.0", "NVIDIA H200"), \
        "6.1 'Measured on one NVIDIA H200 with vLLM 0.26.0': the recording says otherwise"
    floor_s = load_model_spec("qwen3-32b").weight_bytes / get_gpu("H200").hbm_bandwidth_bytes_per_s
    assert t.decode_s[(1, 512)] > floor_s, \
        "6.1 'no step can finish in less than ... ms': the measured batch-1 step is below the weight-read floor"


def test_6_1_sixty_four_sequences_cost_far_less_than_sixty_four_times_one(qwen32_h200):
    step1, step64 = qwen32_h200.decode_s[(1, 512)], qwen32_h200.decode_s[(64, 512)]
    assert 64 / step64 > 40 / step1, \
        "6.1 'A step for 64 sequences took ... only N% longer': batch 64 no longer gives 40x the tokens/s"


def test_6_1_a_short_answer_waits_for_its_long_sibling_under_static_batching():
    static = {m.request_id: m.latency_s for m in _eight_requests("static").requests}
    assert static["r0"] == static["r1"], \
        "6.1 'an answer of 40 tokens paired with one of 300 is returned after ... with static batching'"


def test_6_1_static_keeps_under_half_its_slots_and_paged_over_90_percent():
    static, paged = (_eight_requests(p).summary()["kv_utilisation"] for p in ("static", "paged"))
    assert static < 0.5 < 0.9 < paged, \
        f"6.1 Loss 3 'the static server kept real tokens in N% of the KV slots, the paged engine in M%': {static}, {paged}"


# ---- 6.2 PagedAttention ---------------------------------------------------------------------------------

def test_6_2_a_cuda_block_is_16_tokens_of_kv():
    layout = kv_cache_layout(load_model_spec("llama-3.1-8b"))
    assert layout.block_size == default_block_size("cuda") == 16, "6.2: the CUDA default block is 16 tokens"
    assert layout.bytes_per_block == 16 * layout.kv_bytes_per_token, "6.2: a block's bytes are 16 tokens' KV"


@pytest.fixture(scope="module")
def allocators_6_2():
    """6.2's simulation: 1,000 ShareGPT-like requests, one 4,096-block pool, two allocators."""
    reqs = synthetic_workload(1000, arrival_rate_per_s=20.0, lengths="sharegpt-like", max_model_len=2048, seed=0)
    kw = dict(num_blocks=4096, block_size=16, max_num_seqs=256, max_model_len=2048)
    contig = simulate(reqs, SchedulerConfig(policy="contiguous", reservation="max", **kw)).summary()
    paged = simulate(reqs, SchedulerConfig(policy="paged", **kw)).summary()
    return contig, paged


def test_6_2_paged_holds_tokens_in_over_90_percent_contiguous_in_kwons_range(allocators_6_2):
    contig, paged = allocators_6_2
    assert paged["kv_utilisation"] > 0.9, "6.2: the paged allocator keeps tokens in over 90% of what it allocates"
    assert 0.204 <= contig["kv_utilisation"] <= 0.382, \
        "6.2: the contiguous allocator should fall inside Kwon et al.'s 20.4-38.2% for earlier systems"


def test_6_2_the_freed_memory_more_than_doubles_the_running_batch(allocators_6_2):
    contig, paged = allocators_6_2
    assert paged["mean_running"] > 2 * contig["mean_running"], \
        "6.2 'The freed memory becomes batch: on average N sequences run at once instead of M'"


# ---- 6.3 Continuous batching ----------------------------------------------------------------------------

def test_6_3_continuous_batching_needs_fewer_steps_and_less_latency():
    static, cont = (_eight_requests(p).summary() for p in ("static", "paged"))
    assert cont["num_steps"] < static["num_steps"], "6.3 'the simulator needs N steps with static batches and M'"
    assert cont["latency_mean_s"] < static["latency_mean_s"], "6.3 'the mean request latency from X s to Y s'"


def test_6_3_every_step_of_the_recorded_vllm_cpu_trace_agrees_and_it_preempts():
    from servebook.simulator.engine_trace import compare_traces, recorded_engine_traces, simulated_trace

    case, engine = recorded_engine_traces()["comparison_case"]
    assert engine["vllm"] == "0.27.1", "6.3 'traces recorded from the real engine (vllm-cpu 0.27.1)'"
    assert compare_traces(simulated_trace(case), engine) == [], \
        "6.3 'every step's token assignment and free-block count agree'"
    assert engine["num_preemptions"] > 0, "6.3 'including N preemptions': the recorded case preempts none"


def test_6_3_lab_2_on_an_h200_distinct_prompts_a_multiple_and_padded_slots():
    from servebook.lab.recordings.engine_stats import bench_prefix_caches
    from servebook.lab.analyses.lab2_batching import l2_summary
    from servebook.lab.recordings.recorded import load_recorded, recorded_path

    doc = load_recorded(recorded_path("l2_paged_continuous"), lab="l2_paged_continuous")
    assert (doc["vllm_version"], doc["gpu"]["name"]) == ("0.26.0", "NVIDIA H200"), \
        "6.3 'GPU Lab 2 ran this comparison on one NVIDIA H200 with vLLM 0.26.0'"
    loads = bench_prefix_caches(doc["measurements"])
    assert loads and all(r["query_tokens"] > 0 and r["hit_rate"] < 0.01 for r in loads), \
        "6.3 Lab 2's prompts are distinct: the prefix cache must show (almost) no hit over the load"
    s = l2_summary(doc["measurements"])
    assert s["speedup"] > 1, "6.3 'vLLM produced Nx the static baseline's output throughput' (a multiple)"
    assert s["useful_fraction"] < 1, "6.3 'Static batching spent only N% of its decode slots on tokens anyone asked for'"


# ---- 6.4 Prefill and decode -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def roofline_6_4():
    from servebook.perf.gpu import gpu_numbers

    return load_model_spec("qwen3-32b"), gpu_numbers("H200")


def test_6_4_decode_is_under_the_ridge_and_a_2k_prefill_over_it(roofline_6_4):
    from servebook.perf.roofline import decode_intensity, prefill_intensity, ridge_batch

    spec, h200 = roofline_6_4
    dec = [float(x) for x in decode_intensity(spec, [1, 64], 528)["intensity_flops_per_byte"]]
    pre = float(prefill_intensity(spec, [2048])["intensity_flops_per_byte"][0])
    assert dec[0] < dec[1] < h200.ridge_flops_per_byte < pre, \
        "6.4: decode at batch 1 and 64 sits below the H200's ridge point, a 2,048-token prefill above it"
    assert ridge_batch(spec, "H200", 16384) is None, "6.4: at long contexts decode never becomes compute-bound"


def test_6_4_prefill_runs_near_compute_peak_and_decode_near_bandwidth(roofline_6_4, qwen32_h200):
    from servebook.perf.roofline import prefill_intensity

    spec, h200 = roofline_6_4
    t = qwen32_h200
    assert (t.vllm_version, t.gpu_name) == ("0.26.0", "NVIDIA H200"), "6.4 names one NVIDIA H200, vLLM 0.26.0"
    flops_2k = float(prefill_intensity(spec, [2048])["flops"][0])
    assert flops_2k / t.prefill_s[2048] > 0.4 * h200.bf16_dense_flops, \
        "6.4: a 2,048-token prefill runs at a large share (over 40%) of the H200's bf16 peak"
    assert spec.weight_bytes / t.decode_s[(1, 512)] > 0.6 * h200.hbm_bandwidth_bytes_per_s, \
        "6.4: decode at batch 1 reads the weights at over 60% of the H200's bandwidth"


def test_6_4_longer_prompts_cost_more_than_proportionally_and_longer_contexts_slow_decode(qwen32_h200):
    t = qwen32_h200
    assert t.prefill_s[16384] / t.prefill_s[8192] > 2, \
        "6.4: doubling the prompt from 8,192 to 16,384 tokens more than doubles the prefill"
    assert t.decode_s[(16, 8192)] > t.decode_s[(16, 512)], \
        "6.4: 16 sequences at 8,192 tokens of context decode slower than at 512"


# ---- 6.5 The memory budget ------------------------------------------------------------------------------
GEMMA4_ON_H200 = {"dense": "gemma-4-31b", "moe": "gemma-4-26b-a4b"}  # 6.5's two models


@pytest.fixture(scope="module")
def plans_6_5():
    return {k: make_plan(m, gpu="H200", max_model_len=16384) for k, m in GEMMA4_ON_H200.items()}


@pytest.mark.parametrize("kind", GEMMA4_ON_H200)
def test_6_5_the_four_claims_add_up_to_the_requested_memory(plans_6_5, kind):
    b = plans_6_5[kind].budget
    assert abs(b.weights_gib + b.activation_gib + b.non_torch_gib + b.cudagraph_gib + b.available_kv_gib
               - b.requested_gib) < 1e-6, f"6.5's table ({kind}): weights, working memory and KV are the requested share"


def test_6_5_graphs_are_subtracted_on_the_v1_runner_only(plans_6_5):
    assert plans_6_5["dense"].budget.cudagraph_gib == 0 < plans_6_5["moe"].budget.cudagraph_gib, \
        "6.5 'the graph estimate on the V1 runner only (the MoE here; the dense ... V2)'"


def test_6_5_moe_memory_is_set_by_the_stored_not_the_active_parameters(plans_6_5):
    p = plans_6_5["moe"]
    assert p.budget.weights_gib > 5 * p.spec.params.active * 2 / GIB, \
        "6.5 'Memory is set by the N billion that are stored: X GiB in bf16, not the Y GiB the active count suggests'"


@pytest.mark.parametrize("kind", GEMMA4_ON_H200)
def test_6_5_a_running_request_holds_far_less_than_the_admission_bound_books(plans_6_5, kind):
    p = plans_6_5[kind]
    assert p.running.max_running > 4 * p.capacity.max_concurrency, \
        f"6.5 'the run-time figure is N full-length requests' ({kind}) is no longer several times the logged bound"


def test_6_5_most_layers_use_one_sliding_window():
    windows = {l.sliding_window for l in load_model_spec("gemma-4-31b").layers if l.kind == "sliding"}
    assert len(windows) == 1, "6.5 'most layers use a sliding window of N tokens' (one size)"


def test_6_5_qwen3_32b_shares_each_kv_head_among_eight_query_heads():
    q = load_model_spec("qwen3-32b")
    assert (q.num_attention_heads, q.layers[0].num_kv_heads) == (64, 8), \
        "6.5 'Qwen3-32B has 64 query heads but 8 KV heads' (the common-mistake box)"


def test_6_5_the_dense_weights_take_more_and_the_moes_kv_cache_gets_more(plans_6_5):
    d, m = plans_6_5["dense"].budget, plans_6_5["moe"].budget
    assert d.weights_bytes > m.weights_bytes and m.available_kv_bytes > d.available_kv_bytes, \
        "6.5's figure (alt text): 'The dense 31B's weights take the larger share; the MoE model's KV cache' more"


# ---- 6.6 --gpu-memory-utilization -----------------------------------------------------------------------

def test_6_6_the_recorded_start_up_at_utilization_0_5_divides_its_request():
    from servebook.records import recorded_startup

    start = recorded_startup("h200-vllm0.26.0-2026-11-30-b.json", "llama-3.1-8b--util50")
    log = start.log
    assert (start.vllm_version, start.gpu_name) == ("0.26.0", "NVIDIA H200"), \
        "6.6 'Llama 3.1 8B on one NVIDIA H200 (vLLM 0.26.0)'"
    assert log.gpu_memory_utilization == 0.5, "6.6 'at utilization 0.5'"
    assert abs(log.total_memory_gib * 0.5 - log.requested_memory_gib) < 0.01, \
        "6.6 'the GPU reports X GiB, so the instance requests' half of it"
    parts = log.weights_gib + log.peak_activation_gib + log.non_torch_gib + log.cudagraph_gib + log.available_kv_cache_gib
    assert abs(parts - log.requested_memory_gib) < 0.05, \
        "6.6 'the log divides it into' weights, activation, non-torch, graphs and KV (to its 2-decimal rounding)"


def test_recorded_startup_names_the_cases_of_a_file_when_one_is_missing():
    from servebook.records import recorded_startup

    with pytest.raises(KeyError, match=r"llama-3.1-8b--util50"):
        recorded_startup("h200-vllm0.26.0-2026-11-30-b.json", "no-such-case")


def test_6_6_every_hundredth_of_utilisation_goes_to_the_kv_cache():
    from servebook import DEFAULT_GPU_MEMORY_UTILIZATION

    kv = {u: make_plan("gemma-4-26b-a4b", gpu="H200", max_model_len=16384, gpu_memory_utilization=u)
          .budget.available_kv_gib for u in (0.90, 0.95)}
    assert abs((kv[0.95] - kv[0.90]) - 5 * get_gpu("H200").memory_bytes * 0.01 / GIB) < 1e-6, \
        "6.6 'On an H200, 0.01 of utilization is X GiB, and all of it goes to the KV cache'"
    assert DEFAULT_GPU_MEMORY_UTILIZATION == 0.92, "6.6's table marks 0.92 as the default row"


@pytest.fixture(scope="module")
def lab1_and_lab4():
    from servebook.lab.analyses.lab1_memory import l1_table
    from servebook.lab.analyses.lab4_fp8_kv import l4_table
    from servebook.lab.recordings.recorded import load_recorded, recorded_path

    l1 = load_recorded(recorded_path("l1_memory_budget"), lab="l1_memory_budget")
    l4 = load_recorded(recorded_path("l4_fp8_kv"), lab="l4_fp8_kv")
    pts = [p for p in l1["measurements"]["points"] if p["point"]["kv_cache_dtype"] == "auto"]
    by_u = {p["point"]["gpu_memory_utilization"]: p for p in pts}
    hi, lo = by_u[max(by_u)], by_u[min(by_u)]
    gap = {k: p["prediction"]["available_kv_gib"] - p["engine"]["available_kv_cache_gib"]
           for k, p in (("hi", hi), ("lo", lo))}
    act = {k: p["engine"]["peak_activation_gib"] for k, p in (("hi", hi), ("lo", lo))}
    m4 = l4["measurements"]
    [row4] = l4_table(["auto"], m4["predictions"], m4["engines"])
    pred4 = m4["predictions"]["auto"]
    gap4 = (pred4["kv_cache_tokens"] - m4["engines"]["auto"]["kv_cache_tokens"]) * pred4["kv_bytes_per_token"] / GIB
    return dict(docs=(l1, l4), ratios=[r["engine/predicted"] for r in l1_table(l1["measurements"]["points"])],
                gap=gap, act=act, gap4=gap4, ratio4=row4["engine/predicted"])


def test_6_6_labs_1_and_4_ran_on_one_h200_with_vllm_0_26(lab1_and_lab4):
    for doc in lab1_and_lab4["docs"]:
        assert (doc["vllm_version"], doc["gpu"]["name"]) == ("0.26.0", "NVIDIA H200"), \
            "6.6 'Measured on an H200 ... one NVIDIA H200, vLLM 0.26.0'"


def test_6_6_lab_1_the_error_is_an_amount_of_memory_the_activation_swing(lab1_and_lab4):
    r = lab1_and_lab4
    assert all(0.99 < x < 1.01 for x in r["ratios"]), "6.6 'the logged GPU KV cache size was 0.99x-1.01x the prediction'"
    assert r["gap"]["hi"] > 0 > r["gap"]["lo"], "6.6 'its KV budget was X GiB high at the larger and Y GiB low at the smaller'"
    assert abs((r["gap"]["hi"] - r["gap"]["lo"]) - (r["act"]["hi"] - r["act"]["lo"])) < 0.05, \
        "6.6 'the same swing as the activation peak the engine logged'"


def test_6_6_lab_4_the_same_gap_weighs_a_few_percent_of_a_smaller_pool(lab1_and_lab4):
    r = lab1_and_lab4
    assert abs(r["gap4"] - r["gap"]["hi"]) < 0.05, "6.6 'there the same X GiB as at the higher utilization'"
    assert 0.95 < r["ratio4"] < 0.98, "6.6 'was N% of the KV cache' (a few percent: engine/prediction 0.95-0.98)"


# ---- 6.7 --max-model-len --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def gemma31_lengths():
    """6.7's table: Gemma 4 31B on one H200 at each --max-model-len (defaults otherwise)."""
    lengths = (15000, 16384, 30000, 32768, load_model_spec("gemma-4-31b").max_position_embeddings)
    return {L: make_plan("gemma-4-31b", gpu="H200", max_model_len=L) for L in lengths}


def test_6_7_the_kv_pool_is_the_same_whatever_the_limit(gemma31_lengths):
    blocks = {p.capacity.num_gpu_blocks for p in gemma31_lengths.values()}
    assert len(blocks) == 1, "6.7 'for Gemma 4 31B on one H200 the pool is N blocks whatever the setting'"


def test_6_7_rounding_15000_up_lowers_the_bound_and_costs_nothing_at_run_time(gemma31_lengths):
    p = gemma31_lengths
    assert p[16384].capacity.max_concurrency < p[15000].capacity.max_concurrency, \
        "6.7 'Rounding 15,000 up to 16,384 lowers the logged admission bound by N%'"
    at_16k = make_plan("gemma-4-31b", gpu="H200", max_model_len=16384, request_tokens=15000).running.max_running
    assert at_16k == p[15000].running.max_running, \
        "6.7 '... and costs nothing at run time: requests of 15,000 tokens still run N at once'"


def test_6_7_doubling_the_context_does_not_halve_a_hybrid_model_but_halves_a_dense_one(gemma31_lengths):
    p = gemma31_lengths
    assert p[30000].capacity.max_concurrency > 0.6 * p[15000].capacity.max_concurrency, \
        "6.7 'Doubling the context ... multiplies Gemma 4 31B's logged admission bound by X ..., not by one half'"
    q15, q30 = (make_plan("qwen3-32b", gpu="H200", max_model_len=L) for L in (15000, 30000))
    assert abs(q30.capacity.max_concurrency / q15.capacity.max_concurrency - 0.5) < 0.01, \
        "6.7 'For a dense full-attention model such as Qwen3-32B the logged bound's factor is 0.50'"
    assert q30.running.max_running in (q15.running.max_running // 2, (q15.running.max_running + 1) // 2), \
        "6.7 'the requests running at once halve too (from N to M, whole requests)'"


def test_6_7_the_h200_gemma3_engine_ran_the_run_time_figure_not_the_logged_bound():
    from servebook.lab.e2e.analysis import find_job_record
    from servebook.lab.e2e.running_peak import running_peak
    from servebook.records import e2e_results

    g = find_job_record(e2e_results(), "gemma-3-27b", "peak-6000-96")
    pk = running_peak(g, "peak-6000-96")
    assert (g["vllm_version"], g["gpu"]["name"]) == ("0.26.0", "NVIDIA H200"), "6.7 'Measured on an H200 ... vLLM 0.26.0'"
    assert pk.predicted_running - 1 <= pk.measured_running <= pk.predicted_running, \
        "6.7 'it ran N of them at the same time ...; the run-time figure for that pool and length is M'"
    assert pk.preemptions == 0, "6.7 'it ran N of them at the same time with no preemption'"
    assert pk.measured_running > 8 * pk.logged_admission, \
        "6.7 'for a model with sliding-window layers the logged figure is a floor, not the batch you will get'"
    from servebook import capacity

    args = g["engine_args"]
    at_len = capacity(load_model_spec(g["config"]), int(g["startup"]["parsed"]["available_kv_cache_gib"] * GIB),
                      max_model_len=pk.request_tokens, max_num_batched_tokens=args["max_num_batched_tokens"],
                      async_scheduling=args.get("async_scheduling")).max_concurrency
    # same pool, shorter limit: at most the length ratio more (sliding layers' window booking does not shrink)
    assert pk.logged_admission < at_len <= pk.logged_admission * pk.max_model_len / pk.request_tokens * 1.01, \
        "6.7 'For requests of 6,256 tokens the admission bound is N (what the engine would log with that limit)'"
    assert pk.measured_running > 3 * at_len, \
        "6.7: in the job's own frame the engine still ran several times the admission bound"


# ---- 6.8 --kv-cache-dtype -------------------------------------------------------------------------------

@pytest.mark.parametrize("model", ["gemma-4-31b", "qwen3-32b"])
def test_6_8_fp8_halves_the_bytes_per_token_and_about_doubles_the_concurrency(model):
    spec = load_model_spec(model)
    auto, fp8 = (kv_cache_layout(spec, kv_cache_dtype=d).kv_bytes_per_token for d in ("auto", "fp8"))
    assert auto == 2 * fp8, f"6.8 'it halves the bytes of every cached token' ({model})"
    conc = {d: make_plan(model, gpu="H200", max_model_len=32768, kv_cache_dtype=d).capacity.max_concurrency
            for d in ("auto", "fp8")}
    assert 1.95 < conc["fp8"] / conc["auto"] < 2.05, \
        f"6.8 'the guaranteed concurrency of {model} goes from X to Y requests' (about twice)"


def test_6_8_the_recorded_fp8_start_up_is_what_servebook_predicts():
    from servebook import capacity
    from servebook.records import recorded_startup

    start = recorded_startup("h200-vllm0.26.0-2026-11-30-a.json", "llama-3.1-8b--fp8kv")
    assert (start.vllm_version, start.gpu_name) == ("0.26.0", "NVIDIA H200"), "6.8 'on one NVIDIA H200 (vLLM 0.26.0)'"
    assert start.engine_args["kv_cache_dtype"] == "fp8", "6.8 'Llama 3.1 8B with --kv-cache-dtype fp8'"
    log = start.log
    pred = capacity(load_model_spec("llama-3.1-8b"), log.available_kv_cache_bytes, max_model_len=32768,
                    max_num_batched_tokens=8192, kv_cache_dtype="fp8")
    assert abs(pred.kv_cache_tokens / log.kv_cache_tokens - 1) < 1e-4, \
        "6.8 'servebook predicts the same figure from the same memory' (to the log's 0.01 GiB rounding)"


@pytest.fixture(scope="module")
def lab4():
    from servebook.lab.recordings.recorded import load_recorded, recorded_path

    return load_recorded(recorded_path("l4_fp8_kv"), lab="l4_fp8_kv")


def test_6_8_lab_4_distinct_prompts_on_one_h200(lab4):
    from servebook.lab.recordings.engine_stats import bench_prefix_caches

    assert (lab4["vllm_version"], lab4["gpu"]["name"]) == ("0.26.0", "NVIDIA H200"), \
        "6.8 'Lab 4 ... one NVIDIA H200, vLLM 0.26.0'"
    assert lab4["measurements"]["workload"]["kv_dtypes"] == ["auto", "fp8"], "6.8 'with each cache dtype'"
    loads = bench_prefix_caches(lab4["measurements"])
    assert len(loads) == 2 and all(r["query_tokens"] > 0 and r["hit_rate"] < 0.01 for r in loads), \
        "6.8 Lab 4's prompts are distinct: the prefix cache must show (almost) no hit over either load"


def test_6_8_lab_4_fp8_doubled_the_pool_preempted_less_and_served_more(lab4):
    from servebook.lab.analyses.lab4_fp8_kv import l4_ratios

    w, e = lab4["measurements"]["workload"], lab4["measurements"]["engines"]
    tok_ratio, tput_ratio = l4_ratios(w["kv_dtypes"], e)
    assert 1.99 < tok_ratio < 2.01, "6.8 'the fp8 pool ... N times as many' tokens (twice, to the block)"
    assert e["auto"]["preemptions"] > e["fp8"]["preemptions"] > 0, \
        "6.8 'The bf16 engine preempted N times, the fp8 engine M' (both did, fp8 fewer)"
    assert tput_ratio > 1, "6.8 'fp8 served Nx the output throughput' (more)"
    assert e["auto"]["kv_cache_tokens"] // (w["input_len"] + w["output_len"]) < w["max_num_seqs"], \
        "6.8 'at --gpu-memory-utilization 0.25 so that the pool is the limit' (fewer whole requests than --max-num-seqs)"


def test_6_8_lab_4_each_request_got_its_tokens_more_slowly_with_more_running(lab4):
    from servebook.lab.recordings.engine_stats import logged_max_running

    e = lab4["measurements"]["engines"]
    assert e["fp8"]["bench"]["summary"]["mean_tpot_ms"] > e["auto"]["bench"]["summary"]["mean_tpot_ms"], \
        "6.8 'Each request, though, received its tokens more slowly with fp8'"
    assert logged_max_running(e["fp8"]["log"]) > logged_max_running(e["auto"]["log"]), \
        "6.8 'the larger pool let the engine run more requests at once'"


def test_6_8_sliding_layers_hold_most_bytes_at_admission_and_a_minority_while_decoding():
    plan = make_plan("gemma-4-31b", gpu="H200", max_model_len=32768)
    in_flight = plan.capacity.in_flight_tokens
    admitted, decoding = {"sliding": 0, "full": 0}, {"sliding": 0, "full": 0}
    for layer in kv_cache_layout(plan.spec).layers:
        kind = "sliding" if layer.kind == "sliding" else "full"
        admitted[kind] += layer.blocks_per_request(32768, in_flight) * layer.page_size_bytes
        decoding[kind] += (layer.sliding_window if kind == "sliding" else 32768) * layer.bytes_per_token
    assert admitted["sliding"] / sum(admitted.values()) > 0.75, \
        "6.8 'the sliding layers are N% of the bytes, so keeping them in bf16 gives up most of fp8's gain'"
    assert decoding["sliding"] / sum(decoding.values()) < 0.30, \
        "6.8 'While that request decodes they hold only their window, N% of its bytes' (a minority)"


# ---- 6.9 --max-num-seqs ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def llama70b_tp2_plan():
    """The plan 6.9 prints: its arguments are the drift test's entry 'llama70b-h200-tp2' (vllm_claims.toml)."""
    import tomllib

    from servebook.shipped import VLLM_CLAIMS

    entry = next(e for e in tomllib.loads(VLLM_CLAIMS.read_text())["plan_command"] if e["id"] == "llama70b-h200-tp2")
    return make_plan(entry["config"], **{k: v for k, v in entry.items() if k not in ("id", "section", "config")})


def test_6_9_full_attention_the_ceiling_is_what_runs(llama70b_tp2_plan):
    plan = llama70b_tp2_plan
    cap = plan.capacity
    assert abs(cap.kv_cache_tokens - cap.num_gpu_blocks * cap.block_size) <= plan.max_model_len, \
        "6.9 'servebook predicts N blocks of B tokens per GPU, a GPU KV cache size of T tokens' (T = N x B)"
    assert plan.running.max_running in (int(cap.max_concurrency), int(cap.max_concurrency) - 1), \
        "6.9 'For a full-attention model like this one it is also what runs (N whole requests)'"
    assert plan.recommended_max_num_seqs <= cap.max_concurrency, \
        "6.9 'servebook plan recommends N% of the run-time figure' (no more than the ceiling)"


def test_6_9_a_hybrid_model_runs_several_times_its_logged_figure():
    g = make_plan("gemma-4-31b", gpu="H200", max_model_len=16384)
    assert g.running.max_running > 4 * g.capacity.max_concurrency, \
        "6.9 'Gemma 4 31B on one H200 at 16,384 logs X but runs N full-length requests at once'"


def test_6_9_a_hybrid_below_its_run_time_figure_is_not_safe_from_preemption():
    g = make_plan("gemma-4-31b", gpu="H200", max_model_len=16384)
    run = g.running
    # a request being admitted needs its whole prompt in every group, sliding ones too: more than it
    # holds once it decodes (window + one block per sliding layer)
    assert run.admission_blocks > run.blocks_per_request, \
        "6.9 step 2: 'a prefill holds its window plus its whole chunk in the sliding layers'"
    assert g.capacity.max_concurrency < g.recommended_max_num_seqs < run.max_running, \
        "6.9: 'only the logged admission bound gives that guarantee'; servebook's margin lies between the two"


def test_6_9_simulated_sweep_twice_the_ceiling_is_clean_four_times_is_fastest():
    blocks, bs, length = 2048, 16, 2048
    ceiling = blocks // -(-length // bs)
    assert ceiling == 16, "6.9's sweep table: 'a pool whose worst-case ceiling is 16 requests'"
    reqs = synthetic_workload(1500, arrival_rate_per_s=40.0, lengths="sharegpt-like", max_model_len=length, seed=1)
    sweep = {m: simulate(reqs, SchedulerConfig(num_blocks=blocks, block_size=bs, max_num_seqs=m,
                                               max_model_len=length)).summary() for m in (16, 32, 64, 256)}
    tps = {m: s["output_tokens_per_s"] for m, s in sweep.items()}
    assert sweep[16]["preemptions"] == sweep[32]["preemptions"] == 0, \
        "6.9 'Twice the ceiling still ran without a single preemption on this length mix'"
    assert sweep[64]["preemptions"] > 0 and max(tps, key=tps.get) == 64, \
        "6.9 'four times it was the fastest despite preemptions'"
    assert tps[256] < tps[64], "6.9 'beyond that the recomputation costs more than the larger batch gains'"


def test_6_9_lab_3_the_preemption_knee_lies_between_the_clean_cap_and_the_first_preempting_one():
    from servebook.lab.recordings.engine_stats import bench_prefix_caches
    from servebook.lab.analyses.lab3_preemption import first_preempting, load_l3, preemption_knee

    doc = load_l3()
    assert (doc["vllm_version"], doc["gpu"]["name"]) == ("0.26.0", "NVIDIA H200"), "6.9 'one NVIDIA H200, vLLM 0.26.0'"
    loads = bench_prefix_caches(doc["measurements"])
    assert len(loads) == 4 and max(r["hit_rate"] for r in loads) < 0.01, \
        "6.9 'Every prompt was distinct (the prefix cache served under 1% of each load)'"
    m, w = doc["measurements"], doc["measurements"]["workload"]
    bpr, knee = preemption_knee(w["num_gpu_blocks_override"], w["input_len"], w["output_len"], m["block_size"])
    assert (bpr, knee) == (m["blocks_per_request"], m["predicted_knee"]), \
        "6.9 'Each request ends holding N blocks, so about K fit together' (the lab's own prediction)"
    at = {p["max_num_seqs"]: p for p in m["points"]}
    lo, hi, top = 48, 128, max(at)
    assert at[lo]["preemptions"] == 0 < at[hi]["preemptions"] and at[top]["preemptions"] > 0, \
        "6.9 'At --max-num-seqs 48 nothing was preempted; at 128 the engine preempted N times'"
    assert first_preempting(m["points"]) == hi and lo < knee < hi, \
        "6.9 'The first preempting cap and the last clean one bracket the K of the block arithmetic'"
    assert at[hi]["output_throughput"] / at[lo]["output_throughput"] > 1.2, \
        "6.9 'Just past it, throughput rose despite the preemptions' (128 produced Nx the output throughput of 48)"
    assert at[top]["output_throughput"] / at[hi]["output_throughput"] < 0.95, \
        "6.9 'at N it preempted M times and produced Fx the throughput of 128' (a loss)"
    assert at[top]["preemptions"] == at[hi]["preemptions"], \
        "6.9 'At twice that cap the engine preempted exactly as often, so more recomputation is not why'"
    assert at[top]["mean_tpot_ms"] > at[hi]["mean_tpot_ms"], \
        "6.9 'its mean time per output token rose from X to Y ms'"
    assert doc["engine_args"].get("enforce_eager") is True, \
        "6.9 'with --enforce-eager, so without CUDA graphs'"


# ---- 6.10 --max-num-batched-tokens ----------------------------------------------------------------------

def test_6_10_with_the_cap_reached_the_leftover_budget_admits_nobody():
    n, cap = 40, 32
    steps = simulate([RequestSpec(f"r{i}", 16, 5) for i in range(n)],
                     SchedulerConfig(num_blocks=1000, block_size=16, max_num_seqs=cap, max_num_batched_tokens=8192),
                     record_batches=True).steps
    assert steps.scheduled_tokens[1:5] == [cap] * 4, \
        "6.10 'after the first step, each step schedules 32 tokens — one per running sequence'"
    assert steps.prefill_tokens[1:5] == [0] * 4, "6.10 'tokens of budget go unused' (no prefill chunk is scheduled)"
    assert steps.waiting[1:5] == [n - cap] * 4, "6.10 'while 8 requests wait'"


def test_6_10_the_serve_default_is_8192_and_its_prefill_takes_over_3_5_times_2048s(qwen32_h200):
    from servebook import vllm_batch_defaults

    h200 = get_gpu("H200")
    assert vllm_batch_defaults(h200.memory_bytes, h200.name)[0] == 8192, \
        "6.10's bullets label the 8,192-token rows with the `vllm serve` default on an H200"
    assert (qwen32_h200.vllm_version, qwen32_h200.gpu_name) == ("0.26.0", "NVIDIA H200"), \
        "6.10 'On one NVIDIA H200 (vLLM 0.26.0) a Qwen3-32B prefill'"
    assert qwen32_h200.prefill_s[8192] > 3.5 * qwen32_h200.prefill_s[2048], \
        "6.10 'Step length. Prefill is compute-bound, so a step's time grows with its prefill tokens'"


def test_6_10_about_as_many_requests_run_with_either_budget():
    runs = {t: make_plan("gemma-4-31b", gpu="H200", max_model_len=16384, max_num_batched_tokens=t).running.max_running
            for t in (2048, 8192)}
    assert abs(runs[2048] - runs[8192]) <= 0.05 * runs[8192], \
        f"6.10 'so about as many full-length requests run at once either way': {runs}"


# ---- 6.11 Chunked prefill -------------------------------------------------------------------------------

def _h200_coefficients():
    from servebook import calibrated_coefficients

    return calibrated_coefficients("H200")


def test_6_11_a_50_ms_step_holds_well_under_1000_prompt_tokens(qwen32_h200):
    assert (qwen32_h200.vllm_version, qwen32_h200.gpu_name) == ("0.26.0", "NVIDIA H200"), \
        "6.11 'Recorded on one NVIDIA H200, vLLM 0.26.0' (the H200 above)"
    rate = 2048 / qwen32_h200.prefill_s[2048]
    assert rate * 0.050 < 1000, \
        "6.11 'even an otherwise empty 50 ms step holds only about N prompt tokens of a 32B dense model'"


def test_6_11_the_recommended_budget_keeps_the_target_and_the_default_trades_latency_for_ttft():
    from servebook import vllm_batch_defaults
    from servebook.perf.chunk_budget import recommend_max_num_batched_tokens
    from servebook.perf.long_prompt import predict_long_prompt

    spec, (coeffs, _) = load_model_spec("qwen3-32b"), _h200_coefficients()
    seqs, ctx, target = 32, 8000, 0.050
    r = recommend_max_num_batched_tokens(spec, "H200", coeffs, target_step_s=target, max_num_seqs=seqs,
                                         decode_context_tokens=ctx)
    assert r["recommended_step_s"] <= target, "6.11 step 3: 'whose full step it predicts at N ms' (within the target)"
    default = vllm_batch_defaults(get_gpu("H200").memory_bytes, "H200")[0]
    small, big = (predict_long_prompt(spec, "H200", coeffs, prompt_tokens=15000, decode_batch=seqs,
                                      decode_context_tokens=ctx, max_num_batched_tokens=b)
                  for b in (r["recommended"], default))
    assert sum(big["step_s"]) < sum(small["step_s"]), \
        "6.11 'with the vllm serve default budget of 8,192 it takes X s' (less than with the small budget)"
    assert big["step_s"][0] > 5 * target, "6.11 '... but each of those steps lasts N ms for every decoding user'"


@pytest.fixture(scope="module")
def lab5():
    from servebook.lab.analyses.lab5_chunked_prefill import l5_table
    from servebook.lab.recordings.recorded import load_recorded, recorded_path

    doc = load_recorded(recorded_path("l5_chunked_prefill"), lab="l5_chunked_prefill")
    rows = l5_table(doc["measurements"])
    on = {r["budget"]: r for r in rows if r["chunking"] == "on"}
    off = next(r for r in rows if r["chunking"] == "off")
    return doc, rows, on, off


def test_6_11_lab_5_the_model_got_the_unchunked_gap_and_the_large_budgets_right(lab5):
    doc, rows, on, off = lab5
    assert (doc["vllm_version"], doc["gpu"]["name"]) == ("0.26.0", "NVIDIA H200"), "6.11 'one NVIDIA H200, vLLM 0.26.0'"
    assert all(r["steps predicted"] == r["steps engine"] for r in rows), \
        "6.11 Lab 5: every run took the number of steps the model predicts"
    assert 0.9 < off["worst ITL ms measured"] / off["worst ITL ms predicted"] < 1.1, \
        "6.11 'With chunking off every stream saw one gap of N ms ..., as the model predicts'"
    hi = max(on)
    assert abs(on[hi]["step ms engine"] / on[hi]["step ms predicted"] - 1) < 0.15, \
        "6.11 'it got the unchunked gap and the large budgets right'"


def test_6_11_lab_5_small_chunks_cost_more_and_the_recommended_budget_missed(lab5):
    doc, _, on, _ = lab5
    m = doc["measurements"]
    lo, hi, rec = min(on), max(on), m["prediction"]["recommendation"]["recommended"]
    assert on[lo]["step ms engine"] / on[lo]["step ms predicted"] > 1.5, \
        "6.11 'Smaller budgets were dearer than the model says'"
    assert m["prediction"]["knee"] == rec < m["measured_knee"] == hi, \
        "6.11 Lab 5: the measured knee moved up from the recommended budget to the largest one"
    target_ms = m["prediction"]["recommendation"]["target_step_s"] * 1e3
    assert on[rec]["worst ITL ms measured"] > 2 * target_ms, \
        "6.11 'the budget the procedure above gives ... showed a worst gap of N ms against a target of T ms, X× over'"


# ---- 6.12 Prefix caching --------------------------------------------------------------------------------

def _rag(prefix: int):
    """6.12's simulation: 200 retrieval-style requests sharing a ``prefix``-token prefix, caching on and off."""
    rag = synthetic_workload(200, arrival_rate_per_s=5.0, lengths="alpaca-like", max_model_len=4096,
                             shared_prefix_tokens=prefix, seed=2)
    kw = dict(num_blocks=4096, block_size=16, max_num_seqs=64, max_model_len=4096)
    return rag, simulate(rag, SchedulerConfig(enable_prefix_caching=True, **kw))


def test_6_12_every_request_after_the_first_reuses_the_shared_prefix():
    rag, on = _rag(1024)
    hits = [m.prefix_hit_tokens for m in on.requests]
    assert hits[0] == 0 and set(hits[1:]) == {1024}, \
        "6.12 'A new request ... reuses every leading full block whose hash is already in the pool'"
    assert sum(on.steps.prefill_tokens) == sum(r.prompt_tokens for r in rag) - 1024 * (len(rag) - 1), \
        "6.12 'With caching the engine computes N prompt tokens instead of M' (all but the reused prefixes)"


def test_6_12_a_partly_filled_last_block_is_never_shared():
    _, on = _rag(1030)
    assert {m.prefix_hit_tokens for m in on.requests[1:]} == {1024}, \
        "6.12 'a 1,030-token common prefix gives hits on 1,024 tokens' (64 whole 16-token blocks)"


@pytest.fixture(scope="module")
def lab6():
    from servebook.lab.analyses.lab6_prefix_caching import l6_offline_table, l6_serving_table
    from servebook.lab.recordings.recorded import load_recorded, recorded_path

    doc = load_recorded(recorded_path("l6_prefix_caching"), lab="l6_prefix_caching")
    serve = l6_serving_table(doc["measurements"])
    return (doc, {r["workload"]: r for r in serve if r["caching"] == "on"},
            {r["workload"]: r for r in serve if r["caching"] == "off"},
            {r["order"]: r for r in l6_offline_table(doc["measurements"])})


def test_6_12_lab_6_counters_equal_the_block_rule_and_caching_pays_over_4x(lab6):
    doc, on, off, _ = lab6
    assert (doc["vllm_version"], doc["gpu"]["name"]) == ("0.26.0", "NVIDIA H200"), "6.12 'one NVIDIA H200, vLLM 0.26.0'"
    predicted = doc["measurements"]["predicted"]
    assert all(on[n]["hit tokens"] == predicted[n]["hit_tokens"] and on[n]["queried tokens"] == predicted[n]["query_tokens"]
               for n in on), "6.12 'the engine's hit and query counters equalled the block rule's prediction token for token'"
    assert min(off[n]["mean TTFT ms"] / on[n]["mean TTFT ms"] for n in on) > 4, \
        "6.12 'With caching on the mean TTFT was X ms, with it off Y ms' (over 4x apart)"
    assert min(on[n]["output tok/s"] / off[n]["output tok/s"] for n in on) > 4, \
        "6.12 'output throughput was Nx higher'"


def test_6_12_lab_6_grouping_by_prefix_hits_more_and_runs_faster_than_shuffling(lab6):
    grouped, shuffled = lab6[3]["grouped"], lab6[3]["shuffled"]
    assert grouped["hit rate"] > shuffled["hit rate"], "6.12 'hit X of its prompt tokens when grouped by prefix and Y when shuffled'"
    assert shuffled["wall s"] > grouped["wall s"], "6.12 '... and took Nx as long shuffled'"


# ---- 6.13 Async scheduling and CUDA graphs --------------------------------------------------------------

def test_6_13_async_scheduling_is_the_cuda_default_and_never_on_cpu():
    from servebook import default_async_scheduling

    assert default_async_scheduling("cuda") is True and default_async_scheduling("cpu") is False, \
        "6.13 'the engine turns it on at start-up ... The CPU platform always runs without it'"


def test_6_13_the_recorded_mistral_start_up_captured_graphs_on_the_v2_runner():
    import re

    from servebook.records import recorded_startup

    start = recorded_startup("h200-vllm0.26.0-2026-11-30-b.json", "mistral-7b-v0.1--graphs")
    assert (start.vllm_version, start.gpu_name) == ("0.26.0", "NVIDIA H200"), "6.13 'On one NVIDIA H200 (vLLM 0.26.0)'"
    assert "enforce_eager" not in start.engine_args, "6.13 'Mistral 7B logged Graph capturing finished in' (not eager)"
    took = float(re.search(r"Graph capturing finished in \d+ secs, took ([\d.]+) GiB", start.text).group(1))
    assert abs(start.log.cudagraph_gib - took) < 0.01, "6.13 'using N GiB': the parsed graph memory is the capture line's"
    assert start.log.model_runner == "v2" and "Using V2 Model Runner" in start.text, \
        "6.13 'the V2 runner — the one this dense model ran on (Using V2 Model Runner in its log)'"


def test_6_13_async_scheduling_doubles_the_in_flight_tokens_and_barely_moves_what_runs():
    from servebook import capacity, running_concurrency

    p = make_plan("gemma-4-31b", gpu="H200", max_model_len=16384)
    on, off = (capacity(p.spec, p.available_kv_bytes, max_model_len=16384,
                        max_num_batched_tokens=p.max_num_batched_tokens, async_scheduling=a) for a in (True, False))
    assert p.capacity.max_concurrency == on.max_concurrency, "6.13's plan (CUDA) runs with async scheduling on"
    assert on.in_flight_tokens == 2 * off.in_flight_tokens, "6.13 'two steps' tokens can be in flight at once'"
    assert off.max_concurrency > on.max_concurrency, \
        "6.13 'it logs X requests with async scheduling and Y without' (more without)"
    run_on, run_off = (running_concurrency(c, 16384).max_running for c in (on, off))
    # (what runs is several times the logged bound either way: 33 against 8.4 since the rotary caches
    # entered the weights; the prose states no ratio)
    assert run_on > 3 * off.max_concurrency and run_off - run_on <= 0.02 * run_on, \
        "6.13 'What runs hardly moves: N full-length requests run at once with async scheduling and M without'"


# ---- 6.14 Parallelism -----------------------------------------------------------------------------------

def test_6_14_kv_heads_divide_up_to_tp4_and_replicate_at_tp8():
    g31 = load_model_spec("gemma-4-31b")
    kib = {tp: kv_cache_layout(g31, tp=tp).kv_bytes_per_token for tp in (1, 2, 4, 8)}
    assert kib[2] == kib[1] / 2 and kib[4] == kib[1] / 4, "6.14 'Up to TP 4 every layer's KV heads divide evenly'"
    assert kib[8] > kib[1] / 8, "6.14 'At TP 8 ... each head is stored on two GPUs: N KiB, not the M KiB'"


def test_6_14_tp3_on_gemma4_31b_is_refused():
    from servebook.errors import ServebookError
    from servebook.perf.work import check_tp

    with pytest.raises(ServebookError):
        check_tp(load_model_spec("gemma-4-31b"), 3)  # the page quotes this message


def test_6_14_the_all_reduce_term_was_calibrated_on_two_h200s_over_nvlink():
    from servebook import calibrated_coefficients

    coeffs, _ = calibrated_coefficients("H200")
    assert coeffs.tp_calibrated, "6.14 'The all-reduce term of servebook's step model was calibrated on two H200 GPUs'"
    for model in ("llama-3.1-8b", "qwen3-32b"):
        t2 = step_times(f"{model}-tp2")
        assert (t2.gpu_count, t2.engine_args["tensor_parallel_size"], t2.vllm_version) == (2, 2, "0.26.0"), \
            f"6.14 'Decode steps at 2,048 tokens of context' on two GPUs at TP 2, vLLM 0.26.0 ({model})"


@pytest.fixture(scope="module")
def lab9():
    from servebook.lab.analyses.lab9_parallel import capacity_rows, load_l9, saturation_rows, single_stream_rows

    dense, moe = load_l9("qwen3-32b"), load_l9("qwen3-30b-a3b")
    q32, q30 = load_model_spec("qwen3-32b"), load_model_spec("qwen3-30b-a3b")
    by_config = lambda rows: {r["config"]: r for r in rows}  # noqa: E731
    return dict(docs=(dense["doc"], moe["doc"]), specs=(q32, q30), cap_d=by_config(capacity_rows(dense, q32)),
                one_d=by_config(single_stream_rows(dense, q32)), one_m=by_config(single_stream_rows(moe, q30)),
                sat_d=by_config(saturation_rows(dense)), sat_m=by_config(saturation_rows(moe)))


def test_6_14_lab_9_on_two_h200s_the_kv_arithmetic_held_exactly(lab9):
    dense, moe = lab9["docs"]
    assert dense["vllm_version"] == moe["vllm_version"] == "0.26.0" and dense["gpu"]["count"] == 2, \
        "6.14 'Measured on two H200s (vLLM 0.26.0)'"
    assert all(abs(r["calculator on logged GiB"] / r["KV tokens logged"] - 1) < 1e-4 for r in lab9["cap_d"].values()), \
        "6.14 'The KV arithmetic held exactly: ... the calculator's count from each logged budget'"


def test_6_14_lab_9_tp_speeds_one_dense_request_not_one_moe_request(lab9):
    one_d, one_m = lab9["one_d"], lab9["one_m"]
    assert one_d["TP=1"]["TPOT ms"] / one_d["TP=2"]["TPOT ms"] > 1.5, \
        "6.14 'One request alone decoded at X ms per token on one GPU and Y ms at TP=2'"
    assert abs(one_m["TP=1"]["TPOT ms"] / one_m["TP=2"]["TPOT ms"] - 1) < 0.1, \
        "6.14 'Qwen3-30B-A3B's token hardly moved'"
    bw = get_gpu("H200").hbm_bandwidth_bytes_per_s
    q32, q30 = lab9["specs"]
    read_m, read_d = (s.params.active * 2 / bw * 1e3 for s in (q30, q32))
    assert read_m < 0.5 * one_m["TP=1"]["TPOT ms"], \
        "6.14 'reading its active parameters takes N ms at the H200's peak bandwidth, so most of that step is fixed'"
    assert read_d > 0.6 * one_d["TP=1"]["TPOT ms"], "6.14 'while the dense model's weights take N ms of its M ms'"


def test_6_14_lab_9_tp2_level_with_two_replicas_at_the_engines_behind_one_api_server(lab9):
    sat = lab9["sat_d"]
    assert sat["TP=2"]["client/engine"] > 2, \
        "6.14 'the TP=2 engine made its tokens Nx faster than its one API server delivered them'"
    assert sat["DP=2"]["client out tok/s"] > 1.8 * sat["TP=2"]["client out tok/s"], \
        "6.14 'two replicas delivered X tokens/s to their clients and TP=2 only Y'"
    assert abs(sat["TP=2"]["engine decode tok/s"] / sat["DP=2"]["engine decode tok/s"] - 1) < 0.1, \
        "6.14 'at equal total concurrency TP=2's bigger batch per engine paid for its all-reduces' (level, within 10%)"
    assert sat["DP=2"]["prefix hits % (log)"] < sat["TP=2"]["prefix hits % (log)"], \
        "6.14 'The replicas also hit the prefix cache less'"


# ---- 6.15 MoE vs dense ----------------------------------------------------------------------------------

def test_6_15_one_sequence_reads_top_k_experts_per_layer():
    from servebook.perf import expected_distinct_experts

    moe = load_model_spec("gemma-4-26b-a4b")
    assert float(expected_distinct_experts(moe, 1)) == moe.moe.experts_per_token, \
        "6.15 'One sequence reads top-k experts per layer'"


def test_6_15_batches_stop_at_what_the_dense_model_runs_at_4k():
    plans = {k: make_plan(m, gpu="H200", max_model_len=4096) for k, m in (("m", "gemma-4-26b-a4b"), ("d", "gemma-4-31b"))}
    top = plans["d"].running.max_running
    assert 16 < top, "6.15's table: the largest batch (what the dense model runs at once) lies beyond the 16 column"
    assert top < plans["m"].running.max_running, "6.15 'Under load the MoE also runs bigger batches'"
    assert top > 2 * plans["d"].capacity.max_concurrency, \
        "6.15 'The start-up log's admission bound is lower ... because it books every sliding-window layer at the full context'"


def test_6_15_the_recorded_moe_lead_is_large_at_batch_1_and_narrows():
    tm = step_times("qwen3-30b-a3b-uniform-repeats", folder="step_timing_repeats")
    td = step_times("qwen3-32b")
    assert tm.gpu_count == 1 and tm.vllm_version == td.vllm_version, \
        "6.15 'on one H200 with vLLM 0.26.0': both recordings on one GPU, one release"
    assert tm.record["cases"][0]["environment"]["VLLM_MOE_ROUTING_SIMULATION_STRATEGY"] == "uniform_random", \
        "6.15 'tokens routed uniformly'"
    reps = tm.decode_samples_s[(64, 2048)]
    assert len(reps) == 5, "6.15 'the median of 5 repeats'"
    ratio = {b: td.decode_s[(b, 2048)] / tm.decode_s[(b, 2048)] for b in (1, 64)}
    assert ratio[1] > ratio[64] > 1, \
        "6.15 'Same shape: a large lead at batch 1 that narrows as each step touches more experts'"
    median = tm.decode_s[(64, 2048)]
    clean = [x for x in reps if x <= 2 * median]
    assert len(clean) >= 3, "6.15 'over the other repeats': most repeats carry no stall"
    assert td.decode_s[(64, 2048)] / max(clean) > 1, "6.15 'over the other repeats the MoE leads ... a real lead'"
    assert td.decode_s[(64, 2048)] / min(clean) < ratio[1] / 2, "6.15 'a modest lead, not the several-fold one of a single stream'"
    one = tm.decode_samples_s[(1, 2048)]
    assert (max(one) - min(one)) / min(one) < 0.1, "6.15 'at batch 1 they agree within a few percent'"
    assert max(reps) > 2 * tm.decode_s[(64, 2048)], "6.15 'at batch 64 ... samples took more than twice the median'"


def test_6_15_lab_9_expert_parallelism_emitted_more_than_plain_tp2():
    from servebook.lab.analyses.lab9_parallel import load_l9, saturation_rows

    l9 = load_l9("qwen3-30b-a3b")
    assert l9["doc"]["vllm_version"] == "0.26.0" and l9["doc"]["gpu"]["count"] == 2, \
        "6.15 'Recorded on two H200s (vLLM 0.26.0)'"
    sat = {r["config"]: r for r in saturation_rows(l9)}
    assert sat["TP=2+EP"]["engine decode tok/s"] > sat["TP=2"]["engine decode tok/s"], \
        "6.15 'the expert-parallel engine emitted N tokens/s against M for plain TP=2'"


# ---- 6.16 Speculative decoding --------------------------------------------------------------------------
K_6_16, ALPHA_6_16, CTX_6_16 = 4, 0.7, 1024  # 6.16's table: k = 4, alpha = 70%, 1,024 tokens of context


def _spec_step(model: str, batch: int):
    from servebook import calibrated_coefficients, gpu_numbers
    from servebook.perf.speculative import speculative_step

    gpu = gpu_numbers("H200")
    return speculative_step(load_model_spec(model), gpu, calibrated_coefficients(gpu.name)[0], k=K_6_16,
                            alpha=ALPHA_6_16, batch=batch, context_tokens=CTX_6_16)


def test_6_16_expected_tokens_per_step_is_the_geometric_sum():
    from servebook.perf.speculative import expected_tokens_per_step

    assert abs(expected_tokens_per_step(4, 0.7) - (1 + 0.7 + 0.7**2 + 0.7**3 + 0.7**4)) < 1e-12, \
        "6.16 'the expected tokens per step are 1 + a + a^2 + ... + a^k'"


def test_6_16_the_dense_verify_pass_is_free_at_batch_1_and_not_at_64():
    s1, s64 = _spec_step("gemma-4-31b", 1), _spec_step("gemma-4-31b", 64)
    assert s1.verify_s / s1.plain_step_s < 1.01 < s64.verify_s / s64.plain_step_s, \
        "6.16 'The dense model's verify pass is free at small batches and not at 64'"


def test_6_16_the_moe_pays_most_at_small_batches():
    cost = {b: (s := _spec_step("gemma-4-26b-a4b", b)).verify_s / s.plain_step_s for b in (1, 64)}
    assert cost[1] > cost[64], \
        "6.16 'The MoE pays most at small batches ... At 64 sequences ... verification is cheap again'"


@pytest.fixture(scope="module")
def lab7():
    from servebook.lab.recordings.recorded import load_recorded, recorded_path

    return load_recorded(recorded_path("l7_speculative"), lab="l7_speculative")


def test_6_16_lab_7_acceptance_was_real_and_greedy_output_unchanged(lab7):
    m = lab7["measurements"]
    assert (lab7["vllm_version"], lab7["gpu"]["name"]) == ("0.26.0", "NVIDIA H200"), \
        "6.16 'on one NVIDIA H200 with vLLM 0.26.0'"
    assert lab7["weights"] == "real" and not m["hub_pair"], "6.16 'served a pair it trained on the spot'"
    first = [a["first_position_acceptance"] for n, a in m["acceptance"].items() if n.startswith("draft k=")]
    assert min(first) > 0.5, "6.16 'the draft's first token was accepted X-Y of the time' (more often than not)"
    assert all(v == 1.0 for v in m["identical_to_baseline"].values()), "6.16 'and greedy output was unchanged'"


def test_6_16_lab_7_every_config_was_slower_than_plain_decoding_where_the_model_predicted_faster(lab7):
    from servebook.lab.analyses.lab7_speculative import speedup_rows

    rows = speedup_rows(lab7["measurements"])
    assert {1, 64} <= {r["batch"] for r in rows}, "6.16 'at batch 1 as at 64'"
    assert max(r["measured speedup"] for r in rows) < 1 < min(r["predicted speedup"] for r in rows), \
        "6.16 'every config it measured ... decoded at X-Y× the speed of plain decoding, ... where the step model predicted' > 1"


def test_6_16_lab_7_the_small_targets_step_is_fixed_cost_the_31bs_is_the_weight_read(lab7):
    from servebook.lab.analyses.lab7_speculative import step_rows, weight_read_ms

    m = lab7["measurements"]
    steps = {(r["config"], r["batch"]): r for r in step_rows(m["engines"], m["workload"]["max_tokens"])}
    bw = get_gpu("H200").hbm_bandwidth_bytes_per_s
    target = load_model_spec(m["pair"]["configs"]["target"], name="target")
    plain_ms = steps[("baseline", 1)]["ms per step"]
    assert weight_read_ms(target.weight_bytes, bw) < 0.05 * plain_ms, \
        "6.16 'streaming its N MB of weights is X ms of it: Y% is fixed per-step cost'"
    d2, ng = steps[("draft k=2", 1)], steps[("ngram k=3", 1)]
    assert d2["steps counted"] == "exact" and d2["step / plain step"] > 2 and ng["step / plain step"] > 1.3, \
        "6.16 Lab 7: a speculative step costs well over a plain one on that target (each draft pass adds to it)"
    s1 = _spec_step("gemma-4-31b", 1)
    big_pct = weight_read_ms(load_model_spec("gemma-4-31b").weight_bytes, bw) / (s1.plain_step_s * 1e3) * 100
    assert big_pct > 50 and s1.speedup > 1.5, \
        "6.16 'For Gemma 4 31B at batch 1 the weight read is N% of the modelled step, and the model predicts X×'"


# ---- 6.17 Draft models ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def draft_70b_8b():
    """6.17's table: Llama 3.1 70B on two H200s (TP 2) drafted by Llama 3.1 8B, k = 4, 1,024 tokens, alpha 80%."""
    from servebook import calibrated_coefficients, gpu_numbers
    from servebook.perf.speculative import Drafter, break_even_acceptance, speculative_step

    gpu = gpu_numbers("H200")
    coeffs = calibrated_coefficients(gpu.name)[0]
    target, small = load_model_spec("llama-3.1-70b"), load_model_spec("llama-3.1-8b")
    drafter = Drafter("draft_model", spec=small, tp=2)
    kw = dict(k=4, context_tokens=1024, tp=2)
    return {b: dict(step=speculative_step(target, gpu, coeffs, alpha=0.8, batch=b, drafter=drafter, **kw),
                    be=break_even_acceptance(target, gpu, coeffs, batch=b, drafter=drafter, **kw),
                    be_free=break_even_acceptance(target, gpu, coeffs, batch=b, **kw)) for b in (1, 16, 64)}


def test_6_17_target_and_draft_share_a_vocabulary():
    assert load_model_spec("llama-3.1-70b").vocab_size == load_model_spec("llama-3.1-8b").vocab_size, \
        "6.17 '(same tokenizer, N-token vocabulary)': vLLM 0.32.0 requires equal vocabularies"


def test_6_17_a_draft_model_is_not_free_and_must_be_accepted_more_often_as_the_batch_grows(draft_70b_8b):
    for b, r in draft_70b_8b.items():
        assert r["step"].draft_s >= 0.5 * r["step"].plain_step_s, \
            f"6.17 'The k draft passes take half of one plain step of the target or more' (batch {b})"
        assert r["be"] is not None and r["be_free"] < r["be"], \
            f"6.17's table: the break-even with the 8B drafter is above the free drafter's (batch {b})"
    be = [draft_70b_8b[b]["be"] for b in (1, 16, 64)]
    assert be == sorted(be), "6.17 '... and more often as the batch grows'"


def test_6_17_the_printed_command_is_the_tp2_plan_with_known_speculative_fields():
    import tomllib

    from servebook.shipped import VLLM_CLAIMS

    claims = tomllib.loads(VLLM_CLAIMS.read_text())
    entry = next(e for e in claims["plan_command"] if e["id"] == "llama70b-h200-tp2")
    plan = make_plan(entry["config"], **{k: v for k, v in entry.items() if k not in ("id", "section", "config")})
    assert plan.tp == 2, "6.17 'Llama 3.1 70B on two H200s (TP 2)'"
    known = {d["field"] for d in claims["default"] if d["config"] == "SpeculativeConfig"}
    assert {"method", "model", "num_speculative_tokens", "draft_tensor_parallel_size"} <= known, \
        "6.17's command uses SpeculativeConfig fields the drift test knows"


# ---- 6.18 MTP and other methods -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def runtime_claims():
    """vllm_claims.toml's runtime defaults (each checked against vLLM 0.32.0's source by the drift test)."""
    import tomllib

    from servebook.shipped import VLLM_CLAIMS

    return {e["name"]: e for e in tomllib.loads(VLLM_CLAIMS.read_text())["runtime_default"]}


def test_6_18_the_method_table_names_methods_vllm_accepts(runtime_claims):
    methods = runtime_claims["speculative methods"]["source_literal"]
    for name in ("ngram", "draft_model", "suffix", "medusa", "mlp_speculator", "custom_class"):
        assert f'"{name}"' in methods, f"6.18's method table lists `{name}`; the drift-checked literal lacks it"
    assert '"eagle", "eagle3"' in runtime_claims["EAGLE-family methods"]["source_literal"], \
        "6.18's table: `eagle`, `eagle3` (the EAGLE family)"


def test_6_18_the_ngram_window_default_is_prompt_lookup_min(runtime_claims):
    assert runtime_claims["ngram lookup window default"]["source_literal"] == "self.prompt_lookup_min = 5", \
        "6.18 '`prompt_lookup_min`/`prompt_lookup_max` (both 5 if unset)'"


def test_6_18_deepseek_v3_carries_mtp_layers_and_gemma4_does_not():
    assert load_model_spec("deepseek-v3").raw["num_nextn_predict_layers"] >= 1, \
        "6.18 'DeepSeek-V3's config.json declares N MTP layer'"
    for gemma in ("gemma-4-31b", "gemma-4-26b-a4b"):
        assert "nextn" not in json.dumps(load_model_spec(gemma).raw), \
            f"6.18: the {gemma} config declares no MTP layers"


@pytest.mark.parametrize("batch", [1, 16])
def test_6_18_a_free_drafter_breaks_even_at_lower_acceptance_than_an_8b_one(batch):
    from servebook import calibrated_coefficients, gpu_numbers
    from servebook.perf.speculative import Drafter, break_even_acceptance

    gpu = gpu_numbers("H200")
    coeffs, _ = calibrated_coefficients(gpu.name)
    target, kw = load_model_spec("gemma-4-31b"), dict(k=4, batch=batch, context_tokens=1024)
    free = break_even_acceptance(target, gpu, coeffs, **kw)
    paid = break_even_acceptance(target, gpu, coeffs, drafter=Drafter("draft_model", spec=load_model_spec("llama-3.1-8b")), **kw)
    assert free < paid, "6.18 'Why drafting cost decides': the free drafter's break-even is lower"


# ---- 6.19 Tuning acceptance -----------------------------------------------------------------------------

def test_6_19_the_fourth_draft_survives_24_percent_of_steps():
    assert round(0.7**4, 2) == 0.24, "6.19 'the 24% is the unconditional probability' (0.7^4)"


def test_6_19_the_mean_acceptance_length_gives_alpha_back():
    from servebook.perf.speculative import acceptance_for_tokens_per_step, expected_tokens_per_step

    assert abs(acceptance_for_tokens_per_step(expected_tokens_per_step(4, 0.7), 4) - 0.7) < 1e-9, \
        "6.19 'solving (1 - a^(k+1)) / (1 - a) = N gives a back (70%)'"


def test_6_19_the_hand_written_schedule_follows_the_rules_but_not_with_comments():
    from servebook.errors import ServebookError
    from servebook.perf.speculative import validate_schedule

    validate_schedule([[1, 8, 5], [9, 24, 3], [25, 64, 1], [65, 512, 0]])  # "follows the rules"
    with pytest.raises(json.JSONDecodeError):  # "comments are not JSON"
        json.loads('{"num_speculative_tokens_per_batch_size": [[1, 8, 5],  # quiet: draft aggressively\n]}')
    with pytest.raises(ServebookError):  # "the first range starts at batch 1"
        validate_schedule([[2, 8, 5], [9, 24, 3]])


@pytest.mark.parametrize("alpha", [0.5, 0.7])
def test_6_19_the_derived_schedule_is_a_speculative_config_whose_k_falls_with_load(alpha):
    import tomllib

    from servebook import calibrated_coefficients, gpu_numbers
    from servebook.perf.speculative import k_schedule
    from servebook.shipped import VLLM_CLAIMS

    gpu = gpu_numbers("H200")
    s = k_schedule(load_model_spec("gemma-4-31b"), gpu, calibrated_coefficients(gpu.name)[0], alpha=alpha,
                   context_tokens=4096, max_num_seqs=128, k_max=5, tp=4)
    known = {d["field"] for d in tomllib.loads(VLLM_CLAIMS.read_text())["default"] if d["config"] == "SpeculativeConfig"}
    assert set(s) <= known, "6.19 prints the schedule as --speculative-config JSON: only SpeculativeConfig fields"
    ks = [e[2] for e in s["num_speculative_tokens_per_batch_size"]]
    assert ks == sorted(ks, reverse=True), "6.19 'Letting k fall with load': k falls as the batch grows"


# ---- 6.20 The 15k deployment ----------------------------------------------------------------------------

def _drift_plan(entry_id: str, **override):
    """The plan a deployment page prints: the drift test's plan_command entry ``entry_id`` (vllm_claims.toml)."""
    import tomllib

    from servebook.shipped import VLLM_CLAIMS

    entry = next(e for e in tomllib.loads(VLLM_CLAIMS.read_text())["plan_command"] if e["id"] == entry_id)
    kwargs = {k: v for k, v in entry.items() if k not in ("id", "section", "config")}
    return make_plan(entry["config"], **{**kwargs, **override})


def test_6_20_the_gemma4_31b_h200_start_up_sized_its_cache_as_servebook_predicts():
    from servebook import capacity, read_startup_log
    from servebook.memory_fit import SHIPPED_STARTUP_LOGS, shipped_leave_one_out

    folder = SHIPPED_STARTUP_LOGS / "h200-0.26.0-gemma-4-31b--eager"
    flags = json.loads((folder / "flags.json").read_text())
    log = read_startup_log(folder / "startup.log")
    assert flags["start_completed"] is False and "cutlass" in flags["failure"], \
        "6.20's note: 'the engine sized its KV cache, then failed' (FA4's warm-up: no cutlass module)"
    assert log.vllm_version == "0.26.0" and log.max_model_len == flags["engine_kwargs"]["max_model_len"], \
        "6.20's note: 'vLLM 0.26.0, --max-model-len N'"
    cap = capacity(load_model_spec(folder / "config.json"), log.available_kv_cache_bytes,
                   max_model_len=log.max_model_len, max_num_batched_tokens=log.max_num_batched_tokens)
    assert abs(cap.kv_cache_tokens / log.kv_cache_tokens - 1) <= 0.005, \
        "6.20 'servebook computes N tokens from that budget' (within 0.5% of the logged M)"
    assert round(cap.max_concurrency, 2) == log.max_concurrency, "6.20: the logged concurrency is servebook's"
    row = next(r for r in shipped_leave_one_out() if r.name == folder.name)
    assert abs(row.available_error_pct) <= 2.0, \
        "6.20 'predicts the budget itself from the config and flags alone to N%' (held out, within 2%)"


def test_6_20_its_own_model_held_out_start_up_is_predicted_from_config_and_flags_within_half_a_percent():
    """6.20's note: Gemma 4 26B-A4B's start-up, declared held out before it ran, predicted by
    coefficients that never saw it (memory, and the tokens carried through from that prediction)."""
    from servebook import capacity, read_startup_log
    from servebook.memory import load_coefficients
    from servebook.memory_fit import SHIPPED_STARTUP_LOGS, held_out_names, predict_record, records_from_fixtures

    folder = SHIPPED_STARTUP_LOGS / "h200-0.26.0-gemma-4-26b-a4b--eager16k"
    coefficients = load_coefficients()
    assert folder.name in held_out_names() and folder.name not in coefficients.fitted_on, \
        "6.20's note: 'declared a held-out check before it ran'"
    record = next(r for r in records_from_fixtures(SHIPPED_STARTUP_LOGS) if r.name == folder.name)
    log = read_startup_log(folder / "startup.log")
    predicted = predict_record(record, coefficients)
    assert abs(predicted.available_kv_bytes / record.logged_available_kv_bytes - 1) <= 0.005
    chain = capacity(load_model_spec(folder / "config.json"), predicted.available_kv_bytes,
                     max_model_len=log.max_model_len, max_num_batched_tokens=record.max_num_batched_tokens)
    assert abs(chain.kv_cache_tokens / log.kv_cache_tokens - 1) <= 0.005


def test_6_20_the_command_uses_the_default_utilisation_and_recommends_below_vllms_default():
    plan = _drift_plan("gemma26b-h200-tp4-16k")
    assert plan.gpu_memory_utilization == 0.92, "6.20 '--gpu-memory-utilization 0.92 is the 0.32.0 default'"
    assert plan.recommended_max_num_seqs < plan.default_max_num_seqs, \
        "6.20 'left unset, vLLM 0.32.0 allows N on this GPU and relies on that preemption'"


def test_6_20_15000_token_requests_run_as_many_at_once_under_either_limit():
    rounded = _drift_plan("gemma26b-h200-tp4-16k", request_tokens=15000).running.max_running
    exact = _drift_plan("gemma26b-h200-tp4-16k", max_model_len=15000).running.max_running
    assert rounded == exact, "6.20 'Requests of 15,000 tokens run N at once under either limit'"


def test_6_20_tp4_wins_on_the_logged_bound_four_replicas_on_what_runs():
    tp4, tp1 = _drift_plan("gemma26b-h200-tp4-16k"), _drift_plan("gemma26b-h200-tp4-16k", tp=1)
    assert 4 * tp1.capacity.max_concurrency < tp4.capacity.max_concurrency, \
        "6.20 'N in total against M for one TP 4 engine, because TP 4 stores the weights once'"
    assert 4 * tp1.running.max_running > tp4.running.max_running, "6.20 'By what runs, the replicas hold more'"


def test_6_20_each_global_kv_head_sits_on_two_gpus_at_tp4():
    import json

    from servebook.shipped import MODELS_DIR

    config = json.loads((MODELS_DIR / "gemma-4-26b-a4b.json").read_text())
    heads = config.get("text_config", config)["num_global_key_value_heads"]
    tp = _drift_plan("gemma26b-h200-tp4-16k").tp
    # vLLM replicates KV heads when TP exceeds them: each rank holds max(1, heads // tp) heads.
    per_gpu = max(1, heads // tp)
    assert (heads, tp, per_gpu, tp * per_gpu // heads) == (2, 4, 1, 2), \
        "6.20 'at TP 4 each GPU holds 1 of them, so each head is stored on 2 GPUs'"
    from servebook.vllm_rules.parallel import kv_heads_per_gpu

    layer = next(l for l in _drift_plan("gemma26b-h200-tp4-16k").spec.layers if l.kind == "full")
    assert kv_heads_per_gpu(layer, tp) == per_gpu, "6.20's glued heads per GPU follow vLLM's rule"


def test_6_20_tp4_buys_the_time_to_first_token_of_a_full_prompt():
    from servebook import calibrated_coefficients, get_gpu
    from servebook.perf.model import prefill_request_s

    coeffs, _ = calibrated_coefficients("H200")
    ttft = {}
    for tp in (4, 1):
        p = _drift_plan("gemma26b-h200-tp4-16k", tp=tp)
        ttft[tp] = prefill_request_s(p.spec, get_gpu("H200"), coeffs, prompt_tokens=15000,
                                     max_num_batched_tokens=p.max_num_batched_tokens, tp=tp)
    assert ttft[4] < 0.7 * ttft[1], \
        f"6.20 'a full 15,000-token prompt prefills in about X s at TP 4 against Y s on one GPU' {ttft}"


# ---- 6.21 The 30k deployment ----------------------------------------------------------------------------

def test_6_21_doubling_the_context_does_not_halve_the_batch():
    bf16_32k = _drift_plan("gemma26b-h200-tp4-32k-fp8", kv_cache_dtype="auto")
    bf16_16k = _drift_plan("gemma26b-h200-tp4-32k-fp8", kv_cache_dtype="auto", max_model_len=16384)
    drop = 1 - bf16_32k.running.max_running / bf16_16k.running.max_running
    assert 0.25 < drop < 0.5, f"6.21 'Concurrency does not halve ... N% fewer, not 50%' (running drop {drop:.2f})"
    assert bf16_32k.capacity.max_concurrency > 0.6 * bf16_16k.capacity.max_concurrency, \
        "6.21 'The start-up log's admission bound ... falls from N to M' (far from halved)"


def test_6_21_the_defaults_the_command_keeps():
    plan = _drift_plan("gemma26b-h200-tp4-32k-fp8")
    assert plan.gpu_memory_utilization == 0.92, "6.21 '--gpu-memory-utilization stays at the default 0.92'"
    assert plan.max_num_batched_tokens == 8192, \
        "6.21 '--max-num-batched-tokens stays at 8,192' (the page glues d30_mixed_8192 for that chunk)"
    assert 10240 > plan.max_num_batched_tokens, \
        "6.21 'With the default budget of 8,192, a threshold of 10,240 does nothing'"


# ---- 6.22 Sizing a ten-million-request job ------------------------------------------------------------------

@pytest.fixture(scope="module")
def ten_million():
    """6.22's job and layouts, with the page's arguments: 10M requests of 12,000 in / 3,000 out, eight H100s."""
    from servebook.perf import calibrated_coefficients, gpu_numbers
    from servebook.perf.fleet import Deployment, LengthDistribution, Workload, plan

    gpu = gpu_numbers("h100")
    coeffs, _ = calibrated_coefficients(gpu.name)
    job = Workload(10_000_000, LengthDistribution.fixed(12_000), LengthDistribution.fixed(3_000))
    moe = load_model_spec("gemma-4-26b-a4b")

    def layout(tp, kv, gpus=8, **kw):
        return plan(job, Deployment.of(moe, gpu=gpu, gpus=gpus, name=f"tp{tp}-{kv}", tp=tp, kv_cache_dtype=kv,
                                       max_num_batched_tokens=16384, cudagraph_max_tokens=16384, **kw), coeffs)

    options = {(tp, kv): layout(tp, kv) for tp in (1, 2, 4, 8) for kv in ("auto", "fp8")}
    return moe, layout, options


def test_6_22_fp8_kv_is_faster_at_every_tp_size_and_tp2_fp8_wins(ten_million):
    _, _, options = ten_million
    assert all(options[(tp, "fp8")].hours < options[(tp, "auto")].hours for tp in (1, 2, 4, 8)), \
        "6.22 figure's alt text: fp8 KV is faster at every TP size"
    (best_tp, best_kv), _ = min(options.items(), key=lambda kv_p: kv_p[1].hours)
    assert (best_tp, best_kv) == (2, "fp8"), "6.22 'The fastest layout of Gemma 4 26B-A4B is TP 2 with an fp8 KV cache'"


def test_6_22_the_plan_lies_outside_what_was_measured_in_three_ways(ten_million):
    from servebook.perf.error_bands import Query, assess

    moe, _, options = ten_million
    (best_tp, best_kv), _ = min(options.items(), key=lambda kv_p: kv_p[1].hours)
    a = assess(Query("job", moe, "H100-SXM-80GB", tp=best_tp, context_tokens=15_000, kv_cache_dtype=best_kv))
    assert not a["covers_query"], "6.22 'servebook fleet prints no error band for this plan'"
    assert len(a["outside"]) == 3 and [any(w in r for r in a["outside"]) for w in ("H100", "TP 2", "fp8")] == [True] * 3, \
        "6.22 'outside what was measured in three ways (another GPU, TP above 1 for an MoE model, an fp8 KV cache ...)'"
    assert a["kind"] == "MoE" and all("MoE" in r for r in a["outside"][1:]), "6.22 '... for an MoE model'"
    near = assess(Query("job", moe, "H200-SXM-141GB", tp=1, context_tokens=15_000))
    assert near["covers_query"] and near["band"]["count"] >= 3, "6.22 'the nearest measured regime, MoE jobs on one H200 at TP 1'"


def test_6_22_a_tp2_replica_holds_more_than_linearly_more_kv(ten_million):
    _, _, options = ten_million
    kv1, kv2 = (options[(tp, "fp8")].kv_budget_bytes_per_gpu for tp in (1, 2))
    assert 2 * kv2 / kv1 > 3, "6.22 'more than linearly': a TP 2 replica holds more than 3x one GPU's KV cache"


def test_6_22_the_kv_read_is_a_large_share_of_a_decode_step(ten_million):
    from servebook.perf.work import decode_work, dense_weight_bytes_read, expert_weight_bytes_read

    moe, _, options = ten_million
    best = options[(2, "fp8")]
    w = decode_work(moe, best.batch, best.mean_running_context_tokens, tp=2, kv_cache_dtype="fp8")  # its layout
    weights = dense_weight_bytes_read(moe, 2) + float(expert_weight_bytes_read(moe, w.tokens, 2))
    assert w.kv_read_bytes > 0.5 * weights, "6.22 'the KV cache is a large share of those bytes' (KV read > half the weights)"


def test_6_22_the_mean_step_mixes_decode_only_steps_and_steps_carrying_a_prompt(ten_million):
    import math

    _, _, options = ten_million
    best = options[(2, "fp8")]
    # one token per sequence per step: a request decodes for 3,000 steps, so batch / 3,000 new prompts a step
    prompts_per_step = best.batch / 3_000
    assert best.prefill_tokens_per_step == pytest.approx(prompts_per_step * 12_000), \
        "6.22 'each step carries N prompt tokens' (batch x 12,000 / 3,000)"
    decode_only = math.exp(-prompts_per_step)  # Poisson arrivals: no new prompt in a step
    assert 0.8 < decode_only < 0.9, "6.22 'N% of steps only decode' (most, not all)"
    decode_only_s = best.decode_hours * 3600 / best.steps_per_replica
    carry_s = (best.step_s - decode_only * decode_only_s) / (1 - decode_only)
    assert decode_only_s < best.step_s < carry_s and carry_s > 3 * decode_only_s, \
        "6.22 'No single step takes that long: ... only decode, in X ms; the other N% ... average Y ms'"


def test_6_22_the_prompts_attention_is_hidden_under_the_decode_kv_read(ten_million):
    from servebook.perf import calibrated_coefficients, gpu_numbers
    from servebook.perf.work import decode_work, prefill_work

    moe, _, options = ten_million
    best = options[(2, "fp8")]
    gpu = gpu_numbers("h100")
    coeffs, _ = calibrated_coefficients(gpu.name)
    # roofline by hand: the prompt's attention FLOPs at the calibrated efficiency, the decode KV bytes at theirs
    prompt_s = prefill_work(moe, 12_000, tp=2, kv_cache_dtype="fp8", last_chunk=True).attention_flops \
        / (gpu.bf16_dense_flops * coeffs.attention_eff)
    w = decode_work(moe, best.batch, best.mean_running_context_tokens, tp=2, kv_cache_dtype="fp8")
    kv_s = w.kv_read_bytes / (gpu.hbm_bandwidth_bytes_per_s * coeffs.kv_bandwidth_eff)
    assert 0.5 * kv_s < prompt_s < kv_s * 1.5, \
        "6.22 'Priced alone, a prompt's attention takes X ms; ... the decode tokens' KV read (Y ms per step)'"
    hidden_h = 10_000_000 / best.replicas * prompt_s / 3600
    counted_h = best.prefill_step_terms_s["attention_s"] * best.steps_per_replica / 3600
    assert counted_h < 0.05 * hidden_h, \
        "6.22 'attention N h ... the step model runs it under the decode tokens' KV read ... up to M h more'"


def test_6_22_ngram_drafting_is_not_free_in_vllm(ten_million):
    import tomllib

    from servebook.shipped import VLLM_CLAIMS

    runtime = {e["name"]: e for e in tomllib.loads(VLLM_CLAIMS.read_text())["runtime_default"]}
    # 6.18/6.22: ngram is not among the methods that keep async scheduling on (a checked vLLM claim)
    keeps_async = runtime["async scheduling by speculative method"]["source_literal"]
    assert '"draft_model"' in keeps_async and '"ngram"' not in keeps_async, \
        "6.22 '\"method\": \"ngram\" turns asynchronous scheduling off' (a checked vLLM claim)"
    # 6.19/6.22 '0.27.1 also kept it on the V1 model runner': 0.32.0 keeps V1 only for other methods
    v1_methods = runtime["n-gram drafting runs on the V2 model runner"]["source_literal"]
    assert '"medusa"' in v1_methods and "ngram" not in v1_methods
    text = (BOOK / "06-18-mtp-and-other-methods.md").read_text()
    assert "`ngram` included — turns it off" in text, \
        "6.22 'turns asynchronous scheduling off' rests on 6.18's checked statement"


def test_6_22_speculation_gains_less_at_the_large_batch(ten_million):
    from servebook.perf.fleet import Speculation
    from servebook.perf.speculative import Drafter

    _, layout, options = ten_million
    best = options[(2, "fp8")]
    spec_best = layout(2, "fp8", speculation=Speculation(4, 0.7, Drafter()))
    small = layout(2, "fp8", batch=48)
    spec_small = layout(2, "fp8", batch=48, speculation=Speculation(4, 0.7, Drafter()))
    assert best.hours / spec_best.hours < small.hours / spec_small.hours, "6.22 speculation gains 'less at the large batch'"


def test_6_22_replicas_share_nothing(ten_million):
    _, layout, options = ten_million
    best, big = options[(2, "fp8")], layout(2, "fp8", gpus=64)
    assert best.hours / big.hours == pytest.approx(8, abs=1e-6) and best.gpu_hours == pytest.approx(big.gpu_hours, abs=1e-6), \
        "6.22 'Scaling out: eight times the GPUs, an eighth of the hours, the same GPU-hours'"


def test_6_22_the_worked_example_fed_a_queue_runs_more_and_costs_less(ten_million):
    """6.22 'Against the chapter's worked example': the same engine and flags given a queue instead of the offered
    rate keeps more requests running than the service does, makes more tokens/s per GPU and so costs less per
    million; the service's batch is set by its rate, not by its KV cache."""
    from servebook.perf import calibrated_coefficients, gpu_numbers
    from servebook.perf.fleet import Deployment, LengthDistribution, Workload, plan
    from servebook.simulator.online import OnlineWorkload
    from servebook.simulator.tune import default_max_model_len
    from servebook.simulator.worksheet import example_parameters, worked_example

    moe, _, options = ten_million
    ex, p = worked_example(), example_parameters()
    assert (ex.model, ex.gpu.split("-")[0], ex.tp) == (moe.name, "H200", options[(2, "fp8")].tp), \
        "6.22 'the same Gemma 4 26B-A4B ... H200s at TP 2' (the page's best layout is TP 2 too)"
    gpu = gpu_numbers(ex.gpu)
    requests = 10_000_000
    job = Workload(requests, LengthDistribution.fixed(p["prompt_tokens"]), LengthDistribution.fixed(p["output_tokens"]))
    length = default_max_model_len(OnlineWorkload(p["rate_per_s"], p["prompt_tokens"], p["output_tokens"],
                                                  range_ratio=p["range_ratio"]))
    queue = plan(job, Deployment.of(moe, gpu=gpu, gpus=ex.gpus, tp=ex.tp, kv_cache_dtype=ex.kv_cache_dtype,
                                    max_num_seqs=ex.max_num_seqs, max_num_batched_tokens=ex.max_num_batched_tokens,
                                    max_model_len=length, price_per_gpu_hour=p["assumed_price_per_gpu_hour_usd"]),
                 calibrated_coefficients(gpu.name)[0])
    # the service runs what its rate brings, well below what its cache could run
    assert ex.running_at_rate < ex.full_length_running / 2, "6.22 'the offered rate, not the KV cache, sets how many run'"
    assert queue.batch > 2 * ex.running_at_rate, "6.22 'keeps N of them running instead of about M'"
    tps = queue.output_tokens_per_s / ex.gpus
    per_million = queue.cost / (requests * p["output_tokens"]) * 1e6
    # the cost per million is the GPU-hour price over the tokens an hour makes, for either
    assert per_million == pytest.approx(p["assumed_price_per_gpu_hour_usd"] / (tps * 3600) * 1e6, rel=1e-9)
    assert tps > ex.output_tokens_per_s_per_gpu and per_million < ex.cost_per_million_output_tokens, \
        "6.22 'USD x per million, N x less'"


def test_6_22_the_link_efficiency_is_fitted_at_one_tp_size():
    from servebook.perf.model import load_calibration

    tp_sources = [s for s in load_calibration()["sources"] if s["engine_args"].get("tensor_parallel_size", 1) > 1]
    assert tp_sources and len({s["engine_args"]["tensor_parallel_size"] for s in tp_sources}) == 1, \
        "6.22 'fitted at one TP size only'"


def test_6_22_whole_jobs_ran_slower_than_fleet_promised():
    from servebook.lab.e2e.analysis import fitted_models, job_rows, summary
    from servebook.records import e2e_results

    held = [r for d in e2e_results() for r in job_rows(d, fitted=fitted_models(), detail=False) if r["group"] == "held out"]
    assert held and summary(held)["mean"] > 0, "6.22 'servebook fleet promised N% more output tokens per second than the engine delivered'"
    longest = max(held, key=lambda r: r["requests"])
    assert longest["error"] > 0, "6.22 'even the longest job ... ran slower than fleet predicts'"


# ---- 6.23 Batch tactics ---------------------------------------------------------------------------------

def test_6_23_the_llm_class_gets_twice_the_step_budget_and_the_same_sequences():
    from servebook import vllm_batch_defaults

    h200 = get_gpu("H200")
    llm = vllm_batch_defaults(h200.memory_bytes, h200.name, usage_context="LLM_CLASS")
    srv = vllm_batch_defaults(h200.memory_bytes, h200.name)
    assert llm[0] == 2 * srv[0] and llm[1] == srv[1], \
        "6.23 'vLLM 0.32.0 gives it a 16,384-token step budget by default, against 8,192 for vllm serve (both with N sequences)'"


def test_6_23_the_driver_keeps_groups_together_shortest_first():
    from servebook.batch import submission_order

    a, b = list(range(100, 132)), list(range(200, 232))
    prompts = {"a-long": a + [1] * 40, "b-short": b + [2] * 5, "lone": [7] * 20,
               "a-short": a + [3] * 3, "b-long": b + [4] * 50, "a-mid": a + [5] * 12}
    ids = list(prompts)
    ordered = [ids[i] for i in submission_order([prompts[i] for i in ids], ids, min_shared_tokens=16)]
    assert [x[0] for x in ordered if x != "lone"] in (list("aaabb"), list("bbaaa")), \
        "6.23 '1. Group by shared prefix': the toy input's groups stay together"
    assert ordered.index("a-short") < ordered.index("a-mid") < ordered.index("a-long"), \
        "6.23 '2. Then sort by length within each group ... shortest prompt first'"


@pytest.fixture(scope="module")
def lab8():
    from servebook.lab.analyses.lab8_batch_tactics import load_tactics, recorded_tactics_path

    return load_tactics(recorded_tactics_path())


def test_6_23_lab_8_one_run_per_case_on_one_h200(lab8):
    assert (lab8["vllm_version"], lab8["gpu"]["name"]) == ("0.26.0", "NVIDIA H200"), \
        "6.23 'on one NVIDIA H200 (vLLM 0.26.0)'"
    assert lab8["profile_settings"]["repeats"] == 1 and all(len(c["runs"]) == 1 for c in lab8["cases"]), \
        "6.23 'one run per case'"


def test_6_23_lab_8_no_tactic_moved_throughput_by_more_than_a_few_percent(lab8):
    from servebook.lab.analyses.lab8_batch_tactics import tactic_ratios, tactics_rows

    tps = [r["out tok/s"] for r in tactics_rows(lab8)]
    assert max(tps) / min(tps) < 1.05, "6.23 'Every case ran within N% of the others' (under 5%)"
    r = tactic_ratios(lab8)
    gains = {k: (r[k] - 1) * 100 for k in ("length-sorted vs shuffled", "prefix-grouped vs length-sorted",
                                            "tight vs loose max_tokens")}
    assert all(0 < g < 3 for g in gains.values()), f"6.23 'Sorting by length gained N% ...' (each a small gain): {gains}"
    http_pct = (1 / r["LLM.generate vs HTTP"] - 1) * 100
    assert 0 < http_pct < 3, "6.23 'and vllm serve was N% faster than LLM.generate'"


def test_6_23_lab_8_the_server_and_llm_cases_had_the_same_step_budget(lab8):
    argv = next(c["argv"] for c in lab8["cases"] if c["name"] == "http-server")
    for flag, key in (("--max-num-batched-tokens", "max_num_batched_tokens"), ("--max-num-seqs", "max_num_seqs")):
        assert argv[argv.index(flag) + 1] == str(lab8["engine_args"][key]), \
            f"6.23 'with the same step budget for both (so only the interface differs)': {flag}"


def test_6_23_lab_8_every_order_hit_the_whole_prefixes_and_the_pool_held_them_many_times(lab8):
    from servebook.lab.analyses.lab8_batch_tactics import max_prefix_hit_tokens
    from servebook.lab.recordings.recorded import load_recorded, recorded_path

    runs = [c["runs"][0] for c in lab8["cases"] if c["name"] != "http-server"]
    hits = {r["prefix_cache_hit_tokens"] for r in runs}
    queries = {r["prefix_cache_query_tokens"] for r in runs}
    assert len(queries) == 1 and hits == {max_prefix_hit_tokens(lab8)}, \
        "6.23 'Why grouping had nothing to win on this workload': every order hit every whole prefix"
    w = lab8["profile_settings"]["workload"]
    l1 = load_recorded(recorded_path("l1_memory_budget"), lab="l1_memory_budget")
    assert l1["config_sha256"] == lab8["config_sha256"] and l1["vllm_version"] == lab8["vllm_version"], \
        "6.23: Lab 1's pool is for the same model shape and release as Lab 8"
    util = lab8["engine_args"]["gpu_memory_utilization"]
    pool = next(p["engine"]["kv_cache_tokens"] for p in l1["measurements"]["points"]
                if p["engine"] and p["point"]["gpu_memory_utilization"] == util and p["point"]["kv_cache_dtype"] == "auto")
    assert pool > 10 * w["num_prefixes"] * w["prefix_tokens"], \
        "6.23 'Group by prefix when the prefixes in play outgrow the KV pool': here the pool held them many times"
    out = next(c["runs"][0]["output_tokens"] for c in lab8["cases"] if c["name"] == "llm-generate")
    assert (queries.pop() - hits.pop()) / out > 5, "6.23's Lab 8 workload is prefill-heavy (uncached prompt tokens per output token)"


# ---- 6.24 Defaults --------------------------------------------------------------------------------------
FLAGS_6_24 = ["--max-model-len", "--max-num-seqs", "--tensor-parallel-size", "--gpu-memory-utilization",
              "--max-num-batched-tokens", "--kv-cache-dtype", "--speculative-config", "--long-prefill-token-threshold",
              "--max-cudagraph-capture-size", "--enable-chunked-prefill", "--enable-prefix-caching", "--block-size",
              "--async-scheduling", "--enforce-eager", "--prefix-caching-hash-algo", "--scheduler-reserve-full-isl"]


@pytest.fixture(scope="module")
def flag_claims():
    import tomllib

    from servebook.shipped import VLLM_CLAIMS

    return {f["flag"]: f for f in tomllib.loads(VLLM_CLAIMS.read_text())["flag"]}


def test_6_24_every_flag_the_page_names_is_drift_checked(flag_claims):
    missing = [f for f in FLAGS_6_24 if f not in flag_claims]
    assert not missing, f"6.24's table names flags the drift test does not check: {missing}"


@pytest.mark.parametrize("flag, default", [
    ("--gpu-memory-utilization", 0.92), ("--kv-cache-dtype", "auto"), ("--tensor-parallel-size", 1),
    ("--long-prefill-token-threshold", 0), ("--enforce-eager", False), ("--scheduler-reserve-full-isl", True),
    ("--prefix-caching-hash-algo", "sha256")])
def test_6_24_the_defaults_the_table_quotes_are_the_parsers(flag_claims, flag, default):
    assert flag_claims[flag]["parser_default"] == default, f"6.24's table: {flag} defaults to {default!r}"


def test_6_24_the_library_uses_the_quoted_defaults():
    from servebook import DEFAULT_GPU_MEMORY_UTILIZATION, default_async_scheduling

    assert DEFAULT_GPU_MEMORY_UTILIZATION == 0.92 and default_async_scheduling("cuda") is True, \
        "6.24: servebook's utilisation and async-scheduling defaults are the ones the table quotes"


def test_6_24_leaving_max_model_len_unset_guarantees_fewer_than_three_requests():
    assert make_plan("gemma-4-31b", gpu="H200").capacity.max_concurrency < 3, \
        "6.24 'one H200 guarantees only N full-length Gemma 4 31B requests' (fewer than three)"


def test_6_24_leaving_max_num_seqs_unset_is_well_above_what_the_cache_runs():
    from servebook import vllm_batch_defaults

    h200 = get_gpu("H200")
    seqs = vllm_batch_defaults(h200.memory_bytes, h200.name)[1]
    assert seqs > 1.5 * _drift_plan("gemma26b-h200-tp4-16k").running.max_running, \
        "6.24 'Above what the KV cache runs at once (N× the 15k deployment's M full-length requests)'"


# ---- 6.25 Takeaways -------------------------------------------------------------------------------------

@pytest.mark.parametrize("model", ["gemma-4-31b", "gemma-4-26b-a4b"])
def test_6_25_what_runs_is_several_times_the_logged_bound(model):
    p = make_plan(model, gpu="H200", max_model_len=16384)
    assert p.running.max_running > 4 * p.capacity.max_concurrency, \
        f"6.25 '{model} runs N full-length requests at once, while the start-up log's admission bound says X'"


# ---- 6.27 Beyond one engine ------------------------------------------------------------------------------

def test_6_27_an_8k_llama_prompt_is_one_gib_of_kv_and_its_transfer_is_a_fraction_of_its_prefill():
    # Llama 3.1 8B by hand: 32 layers x 8 KV heads x 128 x (K + V) x 2 bytes = 128 KiB a token
    per_token = 32 * 8 * 128 * 2 * 2
    assert kv_cache_layout(load_model_spec("llama-3.1-8b")).kv_bytes_per_token == per_token
    assert per_token * 8192 == GIB, "6.27 'one 8,192-token prompt of Llama 3.1 8B is 1.00 GiB of KV cache'"
    from servebook import calibrated_coefficients
    from servebook.perf.model import prefill_request_s

    coeffs, _ = calibrated_coefficients("H200")
    prefill = prefill_request_s(load_model_spec("llama-3.1-8b"), get_gpu("H200"), coeffs, prompt_tokens=8192,
                                max_num_batched_tokens=8192, tp=1)
    nic = GIB / (400e9 / 8)
    assert nic < 0.2 * prefill, "6.27 'over one 400-Gb/s port in N ms, a small share of the prefill' (under 20%)"


def test_6_27_llama_70b_in_bf16_does_not_fit_one_h200_and_in_fp8_leaves_room_for_kv():
    from servebook import DEFAULT_GPU_MEMORY_UTILIZATION
    from servebook.errors import ServebookError

    spec = load_model_spec("llama-3.1-70b")
    requested = get_gpu("H200").memory_bytes * DEFAULT_GPU_MEMORY_UTILIZATION
    assert spec.weight_bytes > requested > 1.5 * spec.params.total, \
        "6.27 'more than one H200 gives vLLM ... at one byte per parameter one H200 keeps the rest for KV cache'"
    with pytest.raises(ServebookError):
        make_plan("llama-3.1-70b", gpu="H200", tp=1, max_model_len=8192)
    make_plan("llama-3.1-70b", gpu="H200", tp=2, max_model_len=8192)      # 'it needs TP 2'


def test_6_27_an_mla_latent_is_whole_on_every_tp_rank():
    # DeepSeek-V3 by hand: 61 layers x (kv_lora_rank 512 + rope 64) x 2 bytes, the same at TP 1 and TP 8
    cfg = json.loads((BOOK.parent / "src" / "servebook" / "data" / "models" / "deepseek-v3.json").read_text())
    by_hand = cfg["num_hidden_layers"] * (cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"]) * 2
    spec = load_model_spec("deepseek-v3")
    assert kv_cache_layout(spec).kv_bytes_per_token == kv_cache_layout(spec, tp=8).kv_bytes_per_token == by_hand, \
        "6.27 'N KiB per token per GPU at TP 1 and N KiB at TP 8'"


def test_6_27_every_flag_the_page_names_is_drift_checked(flag_claims):
    text = "\n".join(line for line in (BOOK / "06-27-beyond-one-engine.md").read_text().splitlines()
                     if "servebook" not in line)             # servebook's own flags are checked elsewhere
    named = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", text))
    assert named and not named - set(flag_claims), f"6.27 names unchecked flags: {sorted(named - set(flag_claims))}"
    assert {"--kv-transfer-config", "--kv-offloading-size", "--kv-events-config", "--quantization",
            "--decode-context-parallel-size", "--enable-lora", "--max-loras", "--max-lora-rank"} <= named


# 6.26 Interview drills: "every section 6.1-6.25 needs a drill" is tests/test_drills.py::
# test_at_least_forty_drills_covering_every_section_and_kind.

# ---- flags.md -------------------------------------------------------------------------------------------

def test_flags_page_checks_against_the_pinned_release():
    import tomllib

    import servebook
    from servebook.shipped import VLLM_CLAIMS

    assert tomllib.loads(VLLM_CLAIMS.read_text())["pinned"] == servebook.PINNED_VLLM, \
        "flags.md 'Checked against vLLM 0.32.0': the claims file is for another release than the book pins"


# ---- appendix-draft-corrections.md ----------------------------------------------------------------------

def test_appendix_the_drafts_gemma4_shapes_are_not_the_released_configs():
    from servebook.draft.memory import GEMMA4_26B, GEMMA4_31B

    dense, moe = load_model_spec(GEMMA4_31B.reference_id), load_model_spec(GEMMA4_26B.reference_id)
    kinds = [l.kind == "sliding" for l in dense.layers]
    assert len(kinds) == dense.num_layers != GEMMA4_31B.layers, \
        "appendix: 'Gemma 4 31B has N full-attention layers' (the draft) vs the config's sliding + global layers"
    assert moe.num_layers != GEMMA4_26B.layers and moe.params.total * 2 < GEMMA4_26B.weight_bytes(), \
        "appendix: the draft's 26B-A4B layer count and weight bytes differ from the config's"


def test_appendix_the_drafts_h100_figures_are_the_sxm_parts():
    from servebook import gpu_numbers
    from servebook.draft.fleet import DRAFT_H100_BF16_FLOPS, DRAFT_H100_HBM_BYTES_PER_S

    h100 = gpu_numbers("h100")
    assert abs(DRAFT_H100_BF16_FLOPS / h100.bf16_dense_flops - 1) < 0.001, \
        "appendix 'the draft's N TFLOP/s and M TB/s are the SXM part's' (FLOP/s)"
    assert DRAFT_H100_HBM_BYTES_PER_S == h100.hbm_bandwidth_bytes_per_s, "appendix: ... (bandwidth)"


def test_appendix_the_drafts_30k_deployment_halved_the_15k_sequences_with_fp8():
    from servebook.draft.memory import DRAFT_DEPLOYMENTS

    d15, d30 = DRAFT_DEPLOYMENTS
    assert d30.max_num_seqs * 2 == d15.max_num_seqs and d30.kv_cache_dtype == "fp8", \
        "appendix '30k deployment: fp8 KV and --max-num-seqs N (half the 15k value)'"


def test_appendix_a_50ms_step_of_a_31b_on_an_h100_holds_under_4000_prompt_tokens_even_at_tp8():
    from servebook import calibrated_coefficients, gpu_numbers
    from servebook.draft.memory import GEMMA4_31B
    from servebook.perf.chunk_budget import prefill_tokens_within

    h100 = gpu_numbers("h100")
    fit = prefill_tokens_within(load_model_spec(GEMMA4_31B.reference_id), h100, calibrated_coefficients(h100.name)[0],
                                target_step_s=0.050, tp=8)
    assert fit < 4000, "appendix: the draft's '\"very roughly 4,000-8,000\" prompt tokens' is wrong even at TP 8"
    graphed = prefill_tokens_within(load_model_spec(GEMMA4_31B.reference_id), h100,
                                    calibrated_coefficients(h100.name)[0], target_step_s=0.050, tp=8,
                                    cudagraph_max_tokens=16384)
    assert fit == 512 < graphed < 4000, \
        "appendix: 'from TP 2 up, 512, vLLM's largest CUDA-graph step by default ...; with graphs up to " \
        "16,384 tokens, N at TP 8' (still under 4,000)"


def test_appendix_when_max_num_seqs_binds_nothing_is_admitted():
    res = simulate([RequestSpec(f"r{i}", 16, 5) for i in range(40)],
                   SchedulerConfig(num_blocks=1000, block_size=16, max_num_seqs=32, max_num_batched_tokens=8192))
    assert res.steps.prefill_tokens[1] == 0 and res.steps.waiting[1] == 40 - 32, \
        "appendix 'nothing is admitted while 32 run: N of 8,192 tokens go unused and 8 requests wait'"


def test_appendix_the_drafts_tokens_per_step_need_the_acceptance_it_quotes():
    from servebook.draft.fleet import DRAFT_SCENARIOS, DRAFT_SPEC_K
    from servebook.perf.speculative import acceptance_for_tokens_per_step, expected_tokens_per_step

    accept = DRAFT_SCENARIOS[1][-1]
    alpha = acceptance_for_tokens_per_step(1 + accept, DRAFT_SPEC_K)
    assert abs(expected_tokens_per_step(DRAFT_SPEC_K, alpha) - (1 + accept)) < 1e-9, \
        "appendix: 'the draft's N tokens at k = K need alpha = A%' (alpha gives the tokens back)"


# ---- 6.13: what a step costs outside the full graph (Llama-3.1-8B's long-output job on the H200) -----

def test_6_13_piecewise_and_eager_steps_cost_more_than_the_full_graph_and_eager_is_flat():
    """6.13: "A decode-only step took X ms. ... piecewise graphs: Y ms ... no graph at all: Z ms, about the same
    whatever the size": X < Y < Z with clear gaps, and the eager steps' median is flat in size."""
    from servebook.lab.e2e.analysis import graph_regime_medians
    from servebook.records import e2e_results
    from servebook.vllm_rules import cudagraph_max_tokens

    llama = next(d for d in e2e_results() if d["model_id"] == "llama-3.1-8b")
    job = next(j for j in llama["jobs"] if j["name"].startswith("long-output"))
    r = graph_regime_medians(llama, job, cudagraph_max_tokens(256, 8192))
    assert min(v["steps"] for v in r.values()) >= 50
    assert r["piecewise"]["median_s"] > 1.5 * r["full_graph"]["median_s"]
    assert r["eager"]["median_s"] > 1.5 * r["piecewise"]["median_s"]
    small = graph_regime_medians(llama, job, 512, eager_max_tokens=768)["eager"]
    assert small["steps"] >= 30 and abs(small["median_s"] / r["eager"]["median_s"] - 1) < 0.1
    big = graph_regime_medians(llama, job, 768, eager_max_tokens=2048)["eager"]
    assert big["steps"] >= 10 and abs(big["median_s"] / small["median_s"] - 1) < 0.1, \
        "6.13 'about the same whatever the size': steps above 768 tokens cost what steps below it do"
    few = graph_regime_medians(llama, job, 1000, eager_max_tokens=2048)["eager"]["steps"]
    assert 0 < few < 0.1 * r["eager"]["steps"], \
        "6.13 'all but N of them at or below 1,000 tokens ... how far past that ... this run does not show'"


def test_6_13_gpt_oss_captures_graphs_up_to_1024_tokens():
    """6.13: "gpt-oss sets 1,024 tokens when you set none" (vLLM's GptOssForCausalLMConfig; the drift test finds
    the assignment in the installed vLLM)."""
    from servebook.vllm_rules import cudagraph_max_tokens

    assert cudagraph_max_tokens(256, 8192, architecture="GptOssForCausalLM") == 1024
    assert cudagraph_max_tokens(256, 768, architecture="GptOssForCausalLM") == 768
    assert cudagraph_max_tokens(256, 8192, architecture="LlamaForCausalLM") == 512


def test_moe_page_wide_experts_run_nearer_the_peak_on_the_recorded_kernel():
    """6.15: "Timed on vLLM's fused-MoE kernel on an H200 at 512 tokens per expert, an expert 768 wide
    (Qwen3-30B-A3B) reached X% of the bf16 peak and one 14,336 wide (Mixtral-8x7B) Y%": both points exist at
    512 rows (within 2%), and the wide expert ran nearer the peak."""
    from servebook.perf import calibrate_experts
    from servebook.perf.gpu import gpu_numbers

    (_, kernels), = calibrate_experts.read_records()
    peak = gpu_numbers("h200").bf16_dense_flops
    eff = {}
    for label in ("qwen3-30b-a3b", "mixtral-8x7b"):
        pt = min((p for p in calibrate_experts.kernel_points(kernels) if p["label"] == label),
                 key=lambda p: abs(p["rows"] - 512))
        assert abs(pt["rows"] - 512) < 0.02 * 512, (label, pt["rows"])
        eff[label] = pt["flops"] / pt["seconds"] / peak
    assert eff["mixtral-8x7b"] > eff["qwen3-30b-a3b"] + 0.05


def test_memory_budget_quantized_and_lora_sentences():
    """6.5 "Quantized checkpoints and LoRA adapters": the 16-bit 70B does not fit one H100 while its AWQ
    checkpoint does; the weights shrink "but not by the bit ratio" (more than a quarter of 16-bit);
    the AWQ 8B has more KV tokens; the LoRA slots cost KV tokens."""
    from servebook import DoesNotFitError, LoraSettings

    with pytest.raises(DoesNotFitError, match="use --tp 2"):
        make_plan("llama-3.1-70b", gpu="H100", max_model_len=16384)
    q70 = make_plan("llama-3.1-70b-awq-int4", gpu="H100", max_model_len=16384)
    assert q70.capacity.kv_cache_tokens >= 16384, "6.5: the AWQ 70B serves one full request on one H100"
    w70 = load_model_spec("llama-3.1-70b").weight_bytes
    assert w70 / 4 < q70.spec.weight_bytes < w70 / 2, "6.5: int4 weights are more than a quarter of 16-bit"
    dense = make_plan("llama-3.1-8b", gpu="H100", max_model_len=16384)
    awq = make_plan("llama-3.1-8b-awq-int4", gpu="H100", max_model_len=16384)
    assert awq.capacity.kv_cache_tokens > dense.capacity.kv_cache_tokens, "6.5: AWQ frees KV tokens"
    with_lora = make_plan("llama-3.1-8b-awq-int4", gpu="H100", max_model_len=16384,
                          lora=LoraSettings(max_loras=8, max_lora_rank=64))
    assert with_lora.capacity.kv_cache_tokens < awq.capacity.kv_cache_tokens, "6.5: LoRA slots cost KV tokens"
    # "FP8 weights need compute capability 8.9 ... an A100 runs them weight-only through Marlin"
    a100 = make_plan("qwen3-32b-fp8", gpu="A100", max_model_len=8192)
    assert not a100.kernel.native and "Marlin" in a100.kernel.kernel and "8.9" in a100.kernel.note


# -- 6.11: the live latency search ---------------------------------------------------------------------

def _live_tune_start() -> tuple[dict, dict]:
    """6.11's LIVE dict (the hidden cell's starting values) and its tune directive's options."""
    text = (BOOK / "06-11-chunked-prefill.md").read_text()
    cell = ast.literal_eval(re.search(r"^LIVE = (\{.*?\})$", text, re.S | re.M).group(1))
    block = re.search(r"```\{live-calculator\} tune\n(.*?)```", text, re.S).group(1)
    options = dict(re.findall(r"^:(\w+): (.+)$", block, re.M))
    return cell, options


def test_6_11_the_live_figure_starts_where_the_prose_says():
    cell, options = _live_tune_start()
    assert {k: str(v) for k, v in cell.items()} == options, "6.11's glued starting values are the directive's"


def test_6_11_the_live_search_trades_throughput_per_gpu_for_tpot():
    from servebook import live

    cell, _ = _live_tune_start()
    reply = live.compute({"calculator": "tune", **cell})
    one = next(p for p in reply["frontier"] if p["gpus"] == 1)
    pick = reply["pick"]
    assert one["flags"] == "defaults" and one["tp"] == 1, "6.11 'one H200 at vLLM's defaults makes ...'"
    assert one["tpot_ms"] > cell["tpot_ms"], "6.11 'at a p90 TPOT of N ms, over the target'"
    assert pick["gpus"] > 1 and pick["tpot_ms"] < one["tpot_ms"] and pick["tokens_per_s_per_gpu"] < \
        one["tokens_per_s_per_gpu"], "6.11 'walks on to N GPUs ... the lower TPOT is bought with GPUs'"
    looser = live.compute({"calculator": "tune", **cell, "tpot_ms": cell["tpot_ms"] * 1.5})
    assert looser["pick"]["gpus"] == 1, "6.11 'loosen the target and the pick falls back to one GPU'"
    busier = live.compute({"calculator": "tune", **cell, "rate": cell["rate"] * 4})
    assert busier["pick"]["gpus"] > pick["gpus"], "6.11 'raise the rate and it needs more'"
