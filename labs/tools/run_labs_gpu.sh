#!/usr/bin/env bash
# Run the GPU labs headless in the `gpu` profile, on one H100/H200 (Lab 9: on two); JSON results go to $OUT.
#
#   bash labs/tools/run_labs_gpu.sh plan          # print the plan below, run nothing
#   bash labs/tools/run_labs_gpu.sh check         # imports only (about 20 s)
#   bash labs/tools/run_labs_gpu.sh l1 [l2 ...]   # run these labs, one after another
#   bash labs/tools/run_labs_gpu.sh l9-check      # Lab 9: imports, GPU count, MoE kernels (about 20 s)
#   bash labs/tools/run_labs_gpu.sh l9-dense      # Lab 9 on TWO GPUs, Qwen3-32B:     TP=1, DP=2, TP=2
#   bash labs/tools/run_labs_gpu.sh l9-moe        # Lab 9 on TWO GPUs, Qwen3-30B-A3B: TP=1, DP=2, TP=2, TP=2+EP
#   SERVEBOOK_LAB_L9_CONFIGS=TP=2 bash labs/tools/run_labs_gpu.sh l9-dense   # only these configurations
#   bash labs/tools/run_labs_gpu.sh l3a           # Lab 3, --max-num-seqs 16 and 48 only (SERVEBOOK_LAB_L3_MAX_NUM_SEQS)
#   bash labs/tools/run_labs_gpu.sh l3b           # Lab 3, --max-num-seqs 128 and 256 only
#   bash labs/tools/run_labs_gpu.sh e2e-plan      # end-to-end jobs: each job with fleet's predicted seconds
#   bash labs/tools/run_labs_gpu.sh e2e-check     # end-to-end jobs: imports, vLLM, MoE kernels, the plan (~20 s)
#   bash labs/tools/run_labs_gpu.sh e2e-a         # end-to-end jobs: llama-3.1-8b, qwen3-30b-a3b (one call each target)
#   bash labs/tools/run_labs_gpu.sh e2e-b         # end-to-end jobs: qwen3-32b, mistral-7b-v0.1
#   bash labs/tools/run_labs_gpu.sh e2e-c         # end-to-end jobs: deepseek-v2-lite, gpt-oss-20b
#   bash labs/tools/run_labs_gpu.sh e2e-gemma     # end-to-end jobs: gemma-3-27b + the peak test (recorded 2026-12-01)
#   SERVEBOOK_E2E_MODELS=qwen3-32b bash labs/tools/run_labs_gpu.sh e2e-a   # only these models
#
# Since 2026-12-04 the repository is too large to carry shared/gpu's 40 MiB chunks beside it: stage them
# with `bash labs/tools/gpu_stage.sh`, which prints the four install calls that fit.
# On the lent H200 (see shared/gpu/README.md): install vLLM 0.26.0 with the four `run` calls of
# its "Steps" section (core payload only: the labs use Llama-3.1-8B, no MoE), then ONE `run` call
# per lab, each at once after the previous one (the machine is given back 30 s after a call):
#
#   source /tmp/vllm_offline/env.sh && bash labs/tools/run_labs_gpu.sh l1
#   source /tmp/vllm_offline/env.sh && bash labs/tools/run_labs_gpu.sh l2
#   source /tmp/vllm_offline/env.sh && bash labs/tools/run_labs_gpu.sh l3a   # Lab 3 in two calls:
#   source /tmp/vllm_offline/env.sh && bash labs/tools/run_labs_gpu.sh l3b   # max-num-seqs 16,48 / 128,256
#   source /tmp/vllm_offline/env.sh && bash labs/tools/run_labs_gpu.sh l4
#
# Each lab is capped at 570 s (a `run` call may last 600 s; LAB_TIMEOUT_S overrides the cap), and
# SERVEBOOK_LAB_DEADLINE (Unix seconds: start + cap - 15) tells Labs 3 and 5-7 when to stop starting
# engines; they save after every engine. Files under $OUT:
# <lab>_gpu.json (schema servebook.lab/1, with GPU, driver, vLLM version, config hash, flags, date)
# and <lab>.log (the lab's printed output); l3a and l3b write l3_preemption_16_48_gpu.json and
# l3_preemption_128_256_gpu.json (l3a.log, l3b.log), which the book merges (recorded.load_l3) only
# when GPU, driver, vLLM release, model config and load agree: record both in one session.
# Copy the JSON files, unedited, to labs/results/labs/.
# Model: SERVEBOOK_LAB_MODEL (default llama-3.1-8b, random weights, load_format=dummy: no
# download); SERVEBOOK_LAB_HF_MODEL=<hub repo> serves a real checkpoint on an online node.
#
# Lab 9 (TP vs DP, labs/l9_tp_vs_dp.md) needs a node with TWO GPUs: on the lent 2xH200 use the kind
# `nvidia-h200-x2` for EVERY call (or the machine changes and the install is lost), and install
# vLLM 0.26.0 with the "Steps" section's `run` calls INCLUDING the MoE payload (step 3,
# `.gpu-stage/c4` = vllm-moe.tar.xz.part-00: Qwen3-30B-A3B needs vllm._moe_C; without it the MoE
# run fails at start-up), then ONE `run` call per model, each at once after the previous one:
#
#   source /tmp/vllm_offline/env.sh && bash labs/tools/run_labs_gpu.sh l9-dense
#   source /tmp/vllm_offline/env.sh && bash labs/tools/run_labs_gpu.sh l9-moe
#
# (`l9-check` takes ~20 s: run it with the install's last call, not beside `l9-dense` or `l9-moe`,
# which use the whole 600 s of a call.) l9-dense and l9-moe set SERVEBOOK_LAB_MODEL (qwen3-32b,
# qwen3-30b-a3b) and are capped at 580 s (LAB_TIMEOUT_S overrides it; 10 s to stop after the cap);
# inside it the lab skips a configuration that its own budget (LAB_PARAMS gpu l9 time_budget_s)
# cannot hold and saves its result after every configuration, so a cut-off run still returns what
# it measured. Files under $OUT: l9_tp_vs_dp_<model>_gpu.json (schema servebook.lab/1: GPUs,
# driver, vLLM version, config hash, every engine's flags and full log, per-request timings, the
# predictions) and l9_dense.log / l9_moe.log (the lab's printed output).
# Since issue 26 every vllm serve runs LAB_PARAMS gpu l9 api_server_count API processes
# (--api-server-count 6) and its share of the saturation load goes through bench_clients (6)
# concurrent `vllm bench serve` clients, one seed each (no prompt sent twice). Each saturation point
# then also records, per client, its runs (server_index, client_index, first_start_s) and
# saturated.rate_check: the clients' decode rate (requests / mean client TPOT) beside the engines'
# (requests / mean engine ITL) and whether they agree within 10%; metrics_delta holds the prefix
# cache's /metrics counters (several API processes write no stats log line). Those files describe a
# different load from the 2026-11-30 ones (the workload dict differs), and lab9_parallel.load_l9
# refuses to merge the two: copy them beside the old ones only with the book change that reads them.
# Start-up and bench times with 6+6 processes are not measured yet: the first run says whether the
# 540 s budget still holds TP=1 and DP=2.
# End-to-end jobs (issue 20; servebook.lab.e2e.job, plan in src/servebook/data/e2e_jobs.toml): install
# vLLM 0.26.0 WITH the MoE payload (step 3 of shared/gpu/README.md: qwen3-30b-a3b, deepseek-v2-lite and
# gpt-oss-20b need it), then one `run` call per target, each at once after the previous one:
#
#   source /tmp/vllm_offline/env.sh && bash labs/tools/run_labs_gpu.sh e2e-a
#   source /tmp/vllm_offline/env.sh && bash labs/tools/run_labs_gpu.sh e2e-b
#   source /tmp/vllm_offline/env.sh && bash labs/tools/run_labs_gpu.sh e2e-c
#
# (`e2e-check` takes ~20 s: run it with the install's last call.) Each target is capped at 580 s
# (LAB_TIMEOUT_S overrides it); SERVEBOOK_LAB_DEADLINE (start + cap - 15) makes it skip a model or a
# job that cannot finish in time. Files under $OUT: e2e_<model>.json per model (schema servebook.e2e/1,
# re-written after every job: wall time, tokens, per-request timestamps, peak running requests,
# preemptions, prefix-cache hits, every engine step, the start-up KV figures, fleet's prediction, GPU,
# driver, vLLM version, config hash, every engine flag) and <target>.log (the engines' output).
# Copy the JSON files, unedited, to labs/results/e2e/.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
OUT=${OUT:-$ROOT/labs/results/labs}
PY=${PY:-python3}
LAB_TIMEOUT_S=${LAB_TIMEOUT_S:-}   # empty: 570 s a lab, 580 s for l9-dense / l9-moe
export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"
export SERVEBOOK_LAB_PROFILE=gpu SERVEBOOK_LAB_RESULTS="$OUT" MPLBACKEND=Agg
export SERVEBOOK_ENGINE_LOCK=${SERVEBOOK_ENGINE_LOCK:-/tmp/servebook-vllm-engine.lock}
# NVLink multicast stays off (the lent multi-GPU kinds set these; a program using multicast can put
# a shared host's GPUs out of service). Engines inherit them. vLLM's symmetric-memory all-reduce needs
# multicast and turns itself off without it; VLLM_ALLREDUCE_USE_SYMM_MEM=0 says so up front, so
# TP=2 uses vLLM's custom all-reduce (or NCCL) exactly as it would here anyway.
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0} TORCH_SYMM_MEM_DISABLE_MULTICAST=${TORCH_SYMM_MEM_DISABLE_MULTICAST:-1}
export NVSHMEM_DISABLE_NVLS=${NVSHMEM_DISABLE_NVLS:-1} VLLM_ALLREDUCE_USE_SYMM_MEM=${VLLM_ALLREDUCE_USE_SYMM_MEM:-0}
declare -A FILE=([l1]=l1_memory_budget [l2]=l2_paged_continuous [l3]=l3_preemption [l3a]=l3_preemption
                [l3b]=l3_preemption [l4]=l4_fp8_kv
                [l5]=l5_chunked_prefill [l6]=l6_prefix_caching [l7]=l7_speculative [l8]=l8_batch_tactics
                [l9-dense]=l9_tp_vs_dp [l9-moe]=l9_tp_vs_dp)
# Lab 9 runs once per model; its result file and log are named after the model.
# Lab 3's sweep no longer fits one call (distinct prompts): two calls, each its --max-num-seqs values.
declare -A L3_PART=([l3a]=16,48 [l3b]=128,256)
declare -A L9_MODEL=([l9-dense]=qwen3-32b [l9-moe]=qwen3-30b-a3b)

plan() {
  cat <<'PLAN'
On one H200 with vLLM 0.26.0, Llama-3.1-8B shapes, random weights; every lab is capped at 570 s.
Device time of each lab's `run` call, measured on 2026-11-30 (vLLM already installed):
  l1 memory budget   4 LLM() starts with CUDA graphs (8192/0.9/auto, 32768/0.9/auto,
                     8192/0.5/auto, 8192/0.9/fp8) + 1 refused start   292 s measured
  l2 paged vs static 1 vllm serve (graphs) + bench 256 prompts (512 in/256 out, +-90%)
                     + HF transformers generate, batches of 32, same lengths   365 s (2026-12-01)
  l3 preemption      4 vllm serve, eager, max-num-seqs 16/48/128/256, 2048 blocks,
                     bench 512 prompts (512 in/128 out) at each        435 s with repeated prompts;
                     with distinct prompts (2026-12-01) > 570 s, cut during the 4th engine
                     (per engine: 16 238 s, 48 134 s, 128 124 s, 256 > 74 s when cut), so it runs
                     in two calls, each saving after every engine:
  l3a                max-num-seqs 16, 48     ~372 s (238 + 134) + imports
  l3b                max-num-seqs 128, 256   ~250 s (124 + ~125, as 128) + imports
  l4 fp8 KV          2 vllm serve (graphs, utilisation 0.25), auto vs fp8,
                     bench 512 prompts (1024 in/256 out) each          286 s (2026-12-01)
  l5 chunked prefill 4 vllm serve (graphs), chunking off + budgets 1024/256/128,
                     32 decodes + one 8000-token prompt, 3 repeats each  340 s measured
                     (now 5 engines: budget 2048 added, ~85 s more; the deadline guards it)
  l6 prefix caching  2 vllm serve (graphs), 20,000-block pool, 128 + 96 token-id
                     requests each, offline 192 requests in two orders   250 s measured
  l7 speculative     train a 63M target / 6M draft pair (~50 s), then 5 LLM()
                     with CUDA graphs: baseline, n-gram, draft k=2/4, schedule,
                     2 repeats per batch size   350 s measured (the 5th engine cut by the deadline)
  l8 batch tactics   1 vllm serve + 1 LLM(), 1000 requests, six cases   312 s measured
  The install (shared/gpu/README.md) took 38-41 s of a call plus the machine's start; l1-l4 fill
  most of one 30-minute session, l5-l8 another. Labs 3 and 5-7 read SERVEBOOK_LAB_DEADLINE (set below)
  and save after every engine, so a lab cut by its cap still returns what it measured.

Lab 9 needs 2x H200 (NVLink; kind nvidia-h200-x2), vLLM 0.26.0, random weights, CUDA graphs; per
configuration an engine start, a warm-up, 8 single-stream requests (512 in / 32 out) and 256
requests at once (512 in / 128 out; since issue 26: 6 API processes per vllm serve and 6 bench
clients per server, times below are from before that). Measured on 2026-11-30: a configuration takes 139-243 s
(start 77-164 s with torch.compile; each `vllm bench serve` launch ~25 s of imports), so the lab's
540 s budget holds TP=1 and DP=2 and skips the rest, saying so. Measure the rest in a second call:
  l9-dense  Qwen3-32B      TP=1, DP=2  390 s;  SERVEBOOK_LAB_L9_CONFIGS=TP=2 ... l9-dense   250 s
  l9-moe    Qwen3-30B-A3B  TP=1, DP=2  365 s;  SERVEBOOK_LAB_L9_CONFIGS=TP=2,TP=2+EP ... l9-moe  448 s
  install (core + moe payloads, three calls) ~100 s with the start; all of it: 27 minutes of device
  time, most of one 30-minute session.

End-to-end jobs (issue 20) on one H200, vLLM 0.26.0 with the MoE payload, random weights, CUDA graphs,
max_num_seqs 256, max_num_batched_tokens 8192, gpu_memory_utilization 0.90, max_model_len 8192 (gemma
16384); lognormal lengths, cv 0.5: long-prompt (in ~2000, out ~128) and long-output (in ~250, out ~600).
Per model: one engine start (measured 2026-12-01: 105 s deepseek-v2-lite, 146 s gemma-3-27b, with
imports), a warm-up, and its jobs; fleet's predicted seconds (steady state; the recorded jobs took
1.4-2.1x these: jobs of <= 2 batches of requests are mostly ramp and drain):
  e2e-a      llama-3.1-8b     long-prompt 256 req 14.0 s, long-output 512 req 18.4 s
             qwen3-30b-a3b    long-prompt 384 req 16.3 s, long-output 384 req 20.9 s     ~420 s with starts
  e2e-b      qwen3-32b        long-prompt  96 req 20.1 s, long-output 256 req 31.3 s
             mistral-7b-v0.1  long-prompt 256 req 13.8 s, long-output 512 req 18.1 s     ~440 s with starts
  e2e-c      deepseek-v2-lite long-prompt 512 req 15.7 s (recorded: 29.6 s), long-output 512 req 16.5 s
             gpt-oss-20b      long-prompt 384 req 14.6 s, long-output 512 req 21.1 s     ~420 s with starts
  e2e-gemma  gemma-3-27b      peak test 96 req x (6000 in + 256 out) at once 53.7 s (recorded: 61.4 s,
             74 running, 0 preemptions), long-prompt 96 req 18.8 s (26.1 s), long-output 192 req 23.8 s
             (49.3 s); recorded 2026-12-01 (labs/results/e2e/), re-record only with the others
  Each call is capped at 580 s; `e2e-plan` prints these from the plan file. Still to record: e2e-a,
  e2e-b, e2e-c, about 1,300 s of device time in three calls plus the install (core + moe payloads).
PLAN
}

e2e_check() {
  "$PY" - <<'PY'
import sys, torch, vllm
try:
    import vllm._moe_C_stable_libtorch  # noqa: F401
    moe = "loaded"
except ImportError:
    moe = "ABSENT: install the moe payload (shared/gpu/README.md step 3) before e2e-a / e2e-b"
print("python", sys.version.split()[0], "vllm", vllm.__version__, "torch", torch.__version__,
      "cuda", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-",
      "| MoE kernels:", moe)
PY
  "$PY" -m servebook.lab.e2e.job check --target e2e-a && for t in e2e-b e2e-c e2e-gemma; do
    "$PY" -m servebook.lab.e2e.job plan --target "$t" || return 1; done
}

run_e2e() {
  local key=$1 cap=${LAB_TIMEOUT_S:-580} grace=10
  mkdir -p "$OUT"
  echo "=== $key (end-to-end jobs) start $(date -u +%FT%TZ)"
  local t0=$SECONDS
  export SERVEBOOK_LAB_DEADLINE=$(( $(date +%s) + cap - 15 ))
  timeout --signal=INT --kill-after="$grace" "$cap" "$PY" -m servebook.lab.e2e.job run --target "$key" --out "$OUT"
  local rc=$?
  echo "=== $key exit $rc after $((SECONDS - t0)) s; results: $(ls "$OUT"/e2e_*.json 2>/dev/null | tr '\n' ' ' || echo MISSING)"
  return "$rc"
}

check() {
  "$PY" - <<'PY'
import sys, vllm, torch
import servebook.lab, servebook.plan
from servebook.lab.harness import get_profile
p = get_profile("gpu")
print("python", sys.version.split()[0], "vllm", vllm.__version__, "torch", torch.__version__,
      "cuda", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-")
print("profile", p.name, p.model_id, "catalogue GPU", p.gpu_name, "model dir", p.model_dir())
PY
}

l9_check() {
  "$PY" - <<'PY'
import sys, torch, vllm
import servebook.lab, servebook.lab.analyses.lab9_parallel
from servebook.lab.harness import get_profile
from servebook.lab.analyses.lab9_parallel import visible_gpus
try:
    import vllm._moe_C_stable_libtorch  # noqa: F401
    moe = "loaded"
except ImportError:
    moe = "ABSENT: install the moe payload (shared/gpu/README.md step 3) before `l9-moe`"
p = get_profile("gpu")
print("python", sys.version.split()[0], "vllm", vllm.__version__, "torch", torch.__version__,
      "GPUs (nvidia-smi)", visible_gpus(), "torch sees", torch.cuda.device_count(), "| MoE kernels:", moe)
print("profile", p.name, "catalogue GPU", p.gpu_name)
if visible_gpus() < 2:
    sys.exit("Lab 9 needs two GPUs: ask for the nvidia-h200-x2 kind")
PY
}

run_lab() {
  local key=$1 file=${FILE[$1]:-}
  if [ -z "$file" ]; then
    echo "unknown lab '$key'; use l1 l2 l3 l3a l3b l4 l5 l6 l7 l8 l9-dense l9-moe e2e-a e2e-b e2e-c e2e-gemma plan check l9-check e2e-plan e2e-check" >&2; return 2
  fi
  local model=${L9_MODEL[$key]:-} log=$key result=${file}_gpu.json cap=${LAB_TIMEOUT_S:-570} grace=20
  local -a model_env=()
  if [ -n "$model" ]; then  # 580 + 10 s stays inside a 600 s `run` call
    log=l9_${key#l9-} result="${file}_${model}*_gpu.json" cap=${LAB_TIMEOUT_S:-580} grace=10
    model_env=(env "SERVEBOOK_LAB_MODEL=$model")
  fi
  if [ -n "${L3_PART[$key]:-}" ]; then  # l3_preemption_16_48_gpu.json, l3_preemption_128_256_gpu.json
    result="${file}_${L3_PART[$key]//,/_}_gpu.json"
    model_env=(env "SERVEBOOK_LAB_L3_MAX_NUM_SEQS=${L3_PART[$key]}")
  fi
  mkdir -p "$OUT"
  echo "=== $key ($file${model:+, $model}) start $(date -u +%FT%TZ)"
  local t0=$SECONDS
  # Labs 3 and 5-7 read this (servebook.lab.harness.deadline): they skip or stop engines that cannot finish by
  # then and save after every engine, so a lab cut by the cap still returns what it measured.
  export SERVEBOOK_LAB_DEADLINE=$(( $(date +%s) + cap - 15 ))
  ${model_env[@]+"${model_env[@]}"} timeout --signal=INT --kill-after="$grace" "$cap" \
    "$PY" -m servebook.lab.harness.run_notebook "$ROOT/labs/$file.md" 2>&1 | tee "$OUT/$log.log" | grep -v "^\s*$" | tail -60
  local rc=${PIPESTATUS[0]}
  echo "=== $key exit $rc after $((SECONDS - t0)) s; result: $(ls "$OUT"/$result 2>/dev/null || echo MISSING)"
  return "$rc"
}

[ $# -eq 0 ] && { plan; exit 0; }
status=0
for arg in "$@"; do
  case "$arg" in
    plan) plan ;;
    check) check || status=1 ;;
    l9-check) l9_check || status=1 ;;
    e2e-plan) for t in e2e-a e2e-b e2e-c e2e-gemma; do "$PY" -m servebook.lab.e2e.job plan --target "$t" || status=1; done ;;
    e2e-check) e2e_check || status=1 ;;
    e2e-a|e2e-b|e2e-c|e2e-gemma) run_e2e "$arg" || status=1 ;;
    *) run_lab "$arg" || status=1 ;;
  esac
done
exit $status
