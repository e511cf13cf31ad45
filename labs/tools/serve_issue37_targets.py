import time, json
from servebook.simulator.online import OnlineWorkload
from servebook.simulator.tune import tune, LatencyTargets
Q="labs/tools/models/qwen2-57b-a14b.json"
cases = {"T1": ("gemma-3-27b", 12, 0.5, 0.040, 90), "T2": ("gemma-3-27b", 4, 0.3, 0.030, 90),
         "T3": (Q, 20, 0.5, 0.060, 90), "T4": (Q, 6, 0.3, 0.045, 90), "T5": ("gemma-3-27b", 20, 0.3, 0.035, 50),
         "T6": (Q, 12, 1.0, 0.050, 50)}
out = {}
for k, (model, rate, ttft, tpot, q) in cases.items():
    t=time.time()
    w = OnlineWorkload(rate, 1024, 256, range_ratio=0.5)
    r = tune(model, gpu="h200", max_gpus=8, workload=w, targets=LatencyTargets(ttft, tpot, percentile=q), tps=(1,))
    b = r.best
    out[k] = {"model": model, "rate": rate, "ttft": ttft, "tpot": tpot, "pct": q, "secs": time.time()-t,
              "best": b.to_dict() if b else None, "binding": r.binding}
    print(k, model, rate, f"{time.time()-t:.1f}s", b.serve_command() if b else r.binding, b.replicas if b else "", flush=True)
json.dump(out, open("/tmp/tune_targets.json","w"), indent=1)
