"""How long the scheduler simulator takes for 10,000 requests (goal: under 10 s on one core).

Prints the wall time of each run and its ratio to the goal (< 1.0 meets it). Not a test:
timings depend on the machine. Run: ``python benchmarks/bench_simulator.py [--requests N]``.
The ``paged+perf`` case prices every step with the calibrated performance model
(``PerfStepTime``, ``--perf-model`` on ``--perf-gpu``) instead of the stand-in.
"""
from __future__ import annotations

import argparse
import time

from servebook.simulator import SchedulerConfig, simulate, synthetic_workload
from servebook.simulator.step_time import perf_step_time_for

GOAL_S = 10.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--rate", type=float, default=10.0, help="arrivals per second")
    parser.add_argument("--policies", default="paged,contiguous,static,paged+perf",
                        help="policies to run; paged+perf = paged priced by the performance model")
    parser.add_argument("--perf-model", default="llama-3.1-8b", help="model of the paged+perf case")
    parser.add_argument("--perf-gpu", default="h200", help="GPU of the paged+perf case")
    args = parser.parse_args()
    t0 = time.perf_counter()
    requests = synthetic_workload(args.requests, arrival_rate_per_s=args.rate, max_model_len=2048, seed=0)
    print(f"workload: {args.requests} sharegpt-like requests at {args.rate}/s, built in {time.perf_counter() - t0:.2f} s")
    for case in args.policies.split(","):
        policy, _, pricing = case.partition("+")
        step_model = None
        if pricing == "perf":
            step_model, where = perf_step_time_for(args.perf_model, args.perf_gpu)
            print(f"paged+perf: {args.perf_model} on {args.perf_gpu} ({where})")
        config = SchedulerConfig(num_blocks=4096, block_size=16, max_num_seqs=256,
                                 max_num_batched_tokens=8192, max_model_len=2048, policy=policy)
        t0, c0 = time.perf_counter(), time.process_time()
        result = simulate(requests, config, step_model)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        s = result.summary()
        # CPU time is what one core spends; wall time also counts other processes on a shared machine.
        print(f"{case:10s} cpu {cpu:6.2f} s (wall {wall:6.2f} s)  ratio to {GOAL_S:.0f} s goal: {cpu / GOAL_S:.2f}  "
              f"({s['num_steps']} steps, {s['preemptions']} preemptions, "
              f"{s['output_tokens_per_s']:.0f} output tok/s simulated)")


if __name__ == "__main__":
    main()
