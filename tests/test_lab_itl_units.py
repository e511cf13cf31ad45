"""Lab 5's library parts without an engine: the streaming client against a fake SSE server, the ITL
summaries on hand-made arrival times, the step log reader, the long-prompt schedule and knee."""
from __future__ import annotations

import json
import math
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from servebook.errors import ServebookError
from servebook.lab.errors import LabError
from servebook.lab.harness.itl import (StreamRecord, chunk_token_count, inter_token_gaps, itl_timeline, parse_sse_line,
                                       run_long_prompt_among_decodes, spike_summary, stream_completion)
from servebook.lab.harness.step_log import (STEP_LOG_ENV, prompt_chunks_scheduled, read_step_log, step_intervals,
                                            step_log_engine_args, step_log_env, steps_since)
from servebook.perf.long_prompt import knee, long_prompt_chunks, predict_long_prompt, prefill_steps


# --------------------------------------------------------------------------- SSE parsing
def test_parse_sse_line():
    assert parse_sse_line(b'data: {"a": 1}\n') == {"a": 1}
    assert parse_sse_line("data: [DONE]") == "done"
    assert parse_sse_line(b"\n") is None
    assert parse_sse_line(b": keep-alive\n") is None


def test_chunk_token_count():
    assert chunk_token_count({"choices": [{"text": "ab", "token_ids": [5, 6]}]}) == 2
    assert chunk_token_count({"choices": [], "usage": {}}) == 0
    with pytest.raises(LabError, match="return_token_ids"):
        chunk_token_count({"choices": [{"text": "a"}]})
    with pytest.raises(LabError, match="error"):
        chunk_token_count({"error": {"message": "boom"}})


# --------------------------------------------------------------------------- a fake streaming server
class _FakeCompletions(BaseHTTPRequestHandler):
    """Streams ``max_tokens`` chunks, one token each, ``step_s`` apart; the first chunk of a prompt of
    more than 100 tokens carries a 'prefill' delay of ``prefill_s``. Records what it was sent."""

    step_s = 0.002
    prefill_s = 0.05
    seen: list = []

    def log_message(self, *args):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).seen.append(body)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        if len(body["prompt"]) > 100:
            time.sleep(self.prefill_s)
        for i in range(body["max_tokens"]):
            time.sleep(self.step_s)
            chunk = {"choices": [{"index": 0, "text": "x", "token_ids": [7]}]}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()


@pytest.fixture
def fake_server():
    _FakeCompletions.seen = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _FakeCompletions)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()

    class Server:
        base_url = f"http://127.0.0.1:{httpd.server_address[1]}"
        model = "fake-model"

    yield Server
    httpd.shutdown()


def test_stream_completion_records_every_chunk(fake_server):
    record = StreamRecord("one", prompt_tokens=3, max_tokens=5)
    stream_completion(fake_server.base_url, fake_server.model, [3, 4, 5], record)
    assert record.error is None and record.tokens == 5 and len(record.arrivals_s) == 5
    assert record.arrivals_s == sorted(record.arrivals_s) and record.send_s <= record.arrivals_s[0]
    sent = _FakeCompletions.seen[0]
    assert sent["stream"] is True and sent["return_token_ids"] is True and sent["ignore_eos"] is True
    assert sent["prompt"] == [3, 4, 5] and sent["max_tokens"] == 5 and sent["model"] == "fake-model"


def test_stream_completion_reports_http_errors():
    record = StreamRecord("x", 1, 1)
    stream_completion("http://127.0.0.1:9", "m", [3], record, timeout_s=2)   # port 9: nothing listens
    assert record.error and record.tokens == 0


def test_long_prompt_is_sent_after_the_decodes_warm_up(fake_server):
    run = run_long_prompt_among_decodes(fake_server, decode_requests=3, decode_prompt_tokens=8,
                                        decode_output_tokens=40, long_prompt_tokens=200, long_output_tokens=2,
                                        warm_tokens=5, vocab_size=50, seed=1)
    assert len(run["decodes"]) == 3 and run["attempt"] == 1
    for d in run["decodes"]:
        assert sum(d["tokens_per_chunk"]) == 40
        # at least warm_tokens chunks had arrived before the long prompt was sent
        assert sum(1 for t in d["arrivals_s"] if t <= run["long_send_s"]) >= 5
    bodies = _FakeCompletions.seen
    assert sorted(len(b["prompt"]) for b in bodies) == [8, 8, 8, 200]
    assert all(3 <= t < 50 for b in bodies for t in b["prompt"])
    summary = spike_summary(run)
    # the fake prefill sleeps 50 ms before the first of its chunks, each 2 ms apart
    assert summary["ttft_s"] >= 0.05


def test_run_refuses_decodes_too_short_to_overlap(fake_server):
    with pytest.raises(LabError, match="decode_output_tokens"):
        run_long_prompt_among_decodes(fake_server, decode_requests=1, decode_prompt_tokens=4, decode_output_tokens=4,
                                      long_prompt_tokens=10, warm_tokens=4)



def test_run_without_overlap_is_repeated_then_refused(fake_server):
    # Decodes of 8 tokens, 5 of them before the send: they end ~6 ms after it, while the fake
    # prefill holds the long prompt's first token for 50 ms. No attempt overlaps.
    with pytest.raises(LabError, match="did not run among the decodes"):
        run_long_prompt_among_decodes(fake_server, decode_requests=2, decode_prompt_tokens=4, decode_output_tokens=8,
                                      long_prompt_tokens=200, warm_tokens=5, vocab_size=50, attempts=2)
    # Two attempts of 2 decodes + 1 long prompt each, each attempt with its own prompts.
    bodies = _FakeCompletions.seen
    assert sorted(len(b["prompt"]) for b in bodies) == [4, 4, 4, 4, 200, 200]
    longs = [b["prompt"] for b in bodies if len(b["prompt"]) == 200]
    assert longs[0] != longs[1]


# --------------------------------------------------------------------------- ITL summaries
def _run(decode_arrivals, send, long_arrivals):
    return {"decodes": [{"arrivals_s": a} for a in decode_arrivals], "long_send_s": send,
            "long": {"arrivals_s": long_arrivals}}


def test_inter_token_gaps():
    assert inter_token_gaps([1.0, 1.5, 3.0]) == [(1.5, 0.5), (3.0, 1.5)]
    assert inter_token_gaps([1.0]) == []


def test_spike_summary_by_hand():
    # Two decodes stepping every 10 ms; the prompt sent at 0.035; one 100 ms step (its prefill)
    # ends at 0.14, where the prompt's first token comes out; then 10 ms steps again.
    a = [0.00, 0.01, 0.02, 0.03, 0.04, 0.14, 0.15, 0.16]
    b = [0.005, 0.015, 0.025, 0.035, 0.045, 0.145, 0.155]
    s = spike_summary(_run([a, b], 0.035, [0.14, 0.15]))
    assert s["ttft_s"] == pytest.approx(0.105)
    # gaps before the send: a: 3 of 10 ms; b: 10, 10 ms (its 0.035 arrival is not before 0.035)
    assert s["baseline_itl_s"] == pytest.approx(0.01)
    assert s["worst_itl_s"] == pytest.approx(0.10)
    # chunks strictly between send and the first long token: a: 0.04; b: 0.045
    assert s["decode_chunks_during_prefill"] == [1, 1]
    # gaps ending in (0.035, 0.14]: a: 0.04 (10 ms), 0.14 (100 ms); b: 0.045 (10 ms)
    assert s["prefill_window_itl_s"] == pytest.approx((0.01 + 0.10 + 0.01) / 3)


def test_baseline_ignores_gaps_while_other_prompts_were_prefilled():
    # Decode b's prompt is prefilled in 40 ms steps until its first token at 0.16; only then do both
    # decodes step every 10 ms. Most gaps before the send are a's 40 ms ones, which are not a decode
    # step (the median of all of them would be 40 ms): the baseline is 10 ms.
    a = [0.00, 0.04, 0.08, 0.12, 0.16, 0.17, 0.18, 0.30]
    b = [0.16, 0.17, 0.18, 0.30]
    s = spike_summary(_run([a, b], 0.175, [0.30]))
    assert s["baseline_itl_s"] == pytest.approx(0.01)
    assert s["worst_itl_s"] == pytest.approx(0.12)


def test_spike_summary_needs_gaps_on_both_sides():
    with pytest.raises(LabError, match="warm_tokens"):
        spike_summary(_run([[1.0, 2.0]], 0.5, [3.0]))


def test_itl_timeline_is_relative_and_sorted():
    points = itl_timeline(_run([[1.0, 1.2], [0.9, 1.5]], 1.1, [1.4]))
    assert points == [(pytest.approx(0.1), pytest.approx(0.2)), (pytest.approx(0.4), pytest.approx(0.6))]


# --------------------------------------------------------------------------- step log
def test_step_log_engine_args_per_device():
    assert step_log_engine_args("cpu") == {"scheduler_cls": "servebook.lab.harness.step_recorder.RecordingScheduler"}
    cuda = step_log_engine_args("cuda")
    assert cuda["scheduler_cls"].endswith("RecordingAsyncScheduler") and cuda["async_scheduling"] is True
    with pytest.raises(LabError):
        step_log_engine_args("tpu")
    env = step_log_env({"A": "1"}, "/tmp/x.jsonl")
    assert env == {"A": "1", STEP_LOG_ENV: "/tmp/x.jsonl"}


def test_read_step_log_and_chunks(tmp_path):
    path = tmp_path / "steps.jsonl"
    with pytest.raises(LabError, match=STEP_LOG_ENV):
        read_step_log(path)
    steps = [
        {"t": 1.0, "total": 4, "decodes": 0, "prefills": [[4, 4, 0]]},
        {"t": 2.0, "total": 64, "decodes": 4, "prefills": [[60, 130, 0]]},
        {"t": 3.0, "total": 64, "decodes": 4, "prefills": [[60, 130, 60]]},
        {"t": 3.5, "total": 14, "decodes": 4, "prefills": [[10, 130, 120]]},
    ]
    path.write_text("".join(json.dumps(s) + "\n" for s in steps) + '{"t": 4.0, "tot')   # a line cut mid-write
    assert read_step_log(path) == steps
    assert [s["t"] for s in steps_since(steps, 2.0)] == [2.0, 3.0, 3.5]
    chunks = prompt_chunks_scheduled(steps, 130)
    assert [(c["tokens"], c["before"]) for c in chunks] == [(60, 0), (60, 60), (10, 120)]
    assert step_intervals(steps) == [(1.0, 1.0), (2.0, 1.0), (3.0, 0.5)]


# --------------------------------------------------------------------------- long-prompt schedule
def test_long_prompt_chunks_by_hand():
    # 930 tokens, budget 64, 4 decodes: 60 a step -> 15 full chunks and one of 30.
    chunks = long_prompt_chunks(930, max_num_batched_tokens=64, decode_batch=4)
    assert len(chunks) == 16 and chunks[0] == (60, 0) and chunks[-1] == (30, 900)
    assert prefill_steps(930, max_num_batched_tokens=64, decode_batch=4) == 16 == math.ceil(930 / 60)
    assert long_prompt_chunks(930, max_num_batched_tokens=1024, decode_batch=4, chunked=False) == [(930, 0)]


def test_long_prompt_chunks_refusals():
    with pytest.raises(ServebookError, match="holds the prompt"):
        long_prompt_chunks(1022, max_num_batched_tokens=1024, decode_batch=4, chunked=False)
    with pytest.raises(ServebookError, match="whole"):
        long_prompt_chunks(100, max_num_batched_tokens=8, decode_batch=8)


def test_knee_by_hand():
    pts = [  # budget, TTFT, worst ITL
        {"max_num_batched_tokens": 2048, "ttft_s": 0.20, "worst_itl_s": 0.060},
        {"max_num_batched_tokens": 512, "ttft_s": 0.22, "worst_itl_s": 0.020},   # ITL -67 %, TTFT +10 %
        {"max_num_batched_tokens": 256, "ttft_s": 0.30, "worst_itl_s": 0.010},   # ITL -50 %, TTFT +36 %
        {"max_num_batched_tokens": 128, "ttft_s": 0.50, "worst_itl_s": 0.008},   # ITL -20 %, TTFT +67 %
    ]
    assert knee(pts) == 256
    assert knee(list(reversed(pts))) == 256   # order of the input does not matter
    assert knee(pts[:1]) is None
    assert knee([pts[2], pts[3]]) == 256      # the first step down already costs more than it saves
    with pytest.raises(ServebookError):
        knee([pts[0], {"max_num_batched_tokens": 1, "ttft_s": 0.0, "worst_itl_s": 1.0}])


def test_predicted_trade_off_on_h200():
    from servebook.hf_config import load_model_spec
    from servebook.perf.gpu import gpu_numbers
    from servebook.perf.model import calibrated_coefficients

    spec = load_model_spec("llama-3.1-8b")
    gpu = gpu_numbers("H200")
    coeffs, _ = calibrated_coefficients(gpu.name)
    kw = dict(prompt_tokens=8000, decode_batch=32, decode_context_tokens=528)
    small = predict_long_prompt(spec, gpu, coeffs, max_num_batched_tokens=256, **kw)
    large = predict_long_prompt(spec, gpu, coeffs, max_num_batched_tokens=2048, **kw)
    off = predict_long_prompt(spec, gpu, coeffs, max_num_batched_tokens=8192, chunked=False, **kw)
    assert len(small["chunks"]) == math.ceil(8000 / 224) and len(large["chunks"]) == math.ceil(8000 / 2016)
    # smaller chunks: a smaller worst step, a longer TTFT; every step at least a decode step
    assert small["worst_step_s"] < large["worst_step_s"] < off["worst_step_s"]
    assert small["ttft_s"] > large["ttft_s"] > off["ttft_s"]
    assert min(small["step_s"]) >= small["decode_step_s"]
    # the TTFT is the sum of the prefill steps plus the per-request overhead
    assert small["ttft_s"] == pytest.approx(sum(small["step_s"]) + coeffs.request_overhead_s)


# --------------------------------------------------------------------------- histogram buckets
METRICS_PAGE = """\
# HELP vllm:iteration_tokens_total Histogram of number of tokens per engine_step.
# TYPE vllm:iteration_tokens_total histogram
vllm:iteration_tokens_total_bucket{engine="0",le="1.0",model_name="m"} 2.0
vllm:iteration_tokens_total_bucket{engine="0",le="64.0",model_name="m"} 20.0
vllm:iteration_tokens_total_bucket{engine="0",le="1024.0",model_name="m"} 21.0
vllm:iteration_tokens_total_bucket{engine="0",le="+Inf",model_name="m"} 21.0
vllm:iteration_tokens_total_count{engine="0",model_name="m"} 21.0
vllm:iteration_tokens_total_sum{engine="0",model_name="m"} 1500.0
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="m"} 0.0
"""


def test_histogram_buckets_by_hand():
    from servebook.lab.harness.histogram import buckets_delta, count_above, histogram_buckets

    buckets = histogram_buckets(METRICS_PAGE, "vllm:iteration_tokens_total")
    assert buckets == {1.0: 2.0, 64.0: 20.0, 1024.0: 21.0, math.inf: 21.0}
    assert count_above(buckets, 64.0) == 1.0 and count_above(buckets, 1024.0) == 0.0
    with pytest.raises(LabError, match="bucket bound"):
        count_above(buckets, 100.0)
    earlier = {1.0: 2.0, 64.0: 15.0, 1024.0: 15.0, math.inf: 15.0}
    assert buckets_delta(earlier, buckets) == {1.0: 0.0, 64.0: 5.0, 1024.0: 6.0, math.inf: 6.0}
    assert histogram_buckets(METRICS_PAGE, "vllm:time_to_first_token_seconds") == {}
