#!/usr/bin/python3
"""bf16 against fp32 from bench/run_step_bench.sh --precisions "fp32 bf16":
per (config, threads), the median over rounds of each run's median step for
partrain fp32, partrain bf16, PyTorch fp32 and PyTorch bf16 (torch.autocast),
partrain's bf16 speedup over its own fp32 step and over PyTorch's bf16 step
(issue 40 asks 1.7x and 1.5x), and partrain's activation peak in each
precision (issue 40 asks bf16 <= 0.55x fp32).

    bench/bf16_step_report.py FILE"""
import json, statistics, sys

rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
keys = []
for r in rows:
    k = (r["config"], r["threads"])
    if k not in keys:
        keys.append(k)


def pick(system, prec, cfg, thr):
    return [r for r in rows if r["system"] == system and r.get("precision", "fp32") == prec
            and (r["config"], r["threads"]) == (cfg, thr) and r.get("status", "ok") == "ok"]


def med(rs):
    return statistics.median(r["step_ms_median"] for r in rs) if rs else float("nan")


print("| config | threads | partrain fp32 ms | partrain bf16 ms | bf16 / own fp32 | "
      "PyTorch fp32 ms | PyTorch bf16 ms | partrain bf16 vs PyTorch bf16 | "
      "partrain CPU ms fp32 / bf16 | acts fp32 MiB | acts bf16 MiB | bf16 / fp32 acts |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for cfg, thr in keys:
    pf, pb = pick("partrain", "fp32", cfg, thr), pick("partrain", "bf16", cfg, thr)
    qf, qb = pick("pytorch", "fp32", cfg, thr), pick("pytorch", "bf16", cfg, thr)
    a32 = max((r.get("acts_peak_mib", 0) for r in pf), default=0)
    a16 = max((r.get("acts_peak_mib", 0) for r in pb), default=0)
    # CPU time per step (bench_step's): what the neighbours' load does not stretch
    c32 = statistics.median(r["cpu_ms_median"] for r in pf) if pf else float("nan")
    c16 = statistics.median(r["cpu_ms_median"] for r in pb) if pb else float("nan")
    print("| %s | %d | %.1f | %.1f | **%.2fx** | %.1f | %.1f | **%.2fx** | %.0f / %.0f = %.2fx "
          "| %.1f | %.1f | %.3f |" % (
              cfg, thr, med(pf), med(pb), med(pf) / med(pb), med(qf), med(qb), med(qb) / med(pb),
              c32, c16, c32 / c16, a32, a16, a16 / a32 if a32 else float("nan")))
