#!/usr/bin/python3
"""The side-by-side table of bench/run_step_bench.sh, from its raw JSON lines
(partrain's bench_step --json and the peer's RESULT objects, one per run).

    bench/step_bench_report.py FILE

Per (config, threads) and system: the median over rounds of each run's median
step, and the best single step seen (min over runs): on a shared machine the
median carries the neighbours' load, the best step shows each system's speed
when it had the cores. Checks that both sides do the same work (parameter count
and FLOPs per step from the architecture)."""
import json, statistics, sys

rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
rows = [r for r in rows if r.get("precision", "fp32") == "fp32"]  # bf16: bf16_step_report.py
for r in rows:
    if r.get("status", "ok") != "ok":
        sys.exit("pytorch run failed: %s" % r.get("error"))


def flops(L, C, V, T, B, n_params):
    # Same count as bench_step.c: 6 x non-embedding params x tokens, LM head,
    # attention over the FULL T x T (what PyTorch computes).
    N = B * T
    return 6.0 * (n_params - V * C - T * C) * N + 6.0 * N * C * V + 12.0 * L * B * T * T * C


keys = []
for r in rows:
    k = (r["config"], r["threads"])
    if k not in keys:
        keys.append(k)
hdr = ("config", "thr", "partrain_ms", "pytorch_ms", "speedup", "round_ratios", "best_ms",
       "best_ratio", "GFLOP/s", "torch_GFLOP/s", "sgemm_peak", "%peak", "cpu%", "load")
print("%-6s %3s %11s %10s %7s %12s %13s %10s %7s %13s %10s %6s %5s %9s" % hdr)
out = []
for cfg, thr in keys:
    pa = [r for r in rows if r["system"] == "partrain" and (r["config"], r["threads"]) == (cfg, thr)]
    py = [r for r in rows if r["system"] == "pytorch" and (r["config"], r["threads"]) == (cfg, thr)]
    if not pa or not py:
        continue
    p0, q0 = pa[0], py[0]
    # Same work: the same parameter count and the same FLOPs per step.
    fq = flops(q0["n_layer"], q0["n_embd"], q0["vocab"], q0["T"], q0["B_per_rank"], q0["n_params"])
    same = p0["n_params"] == q0["n_params"] and abs(fq - p0["flops_per_step"]) <= 1e-6 * fq
    if not same:
        print("# MISMATCH %s: params partrain %d pytorch %d, FLOPs %.6e vs %.6e" % (
            cfg, p0["n_params"], q0["n_params"], p0["flops_per_step"], fq))
    pms = statistics.median(r["step_ms_median"] for r in pa)
    qms = statistics.median(r["step_ms_median"] for r in py)
    pbest = min(r["step_ms_min"] for r in pa)
    qbest = min(r["step_ms_min"] for r in py)
    ratios = sorted(q["step_ms_median"] / p["step_ms_median"]
                    for p in pa for q in py if p["round"] == q["round"])
    peak = statistics.median(r["sgemm_peak_gflops"] for r in pa)
    gf = p0["flops_per_step"] / (pms / 1e3) / 1e9
    qgf = fq / (qms / 1e3) / 1e9
    row = {"config": cfg, "threads": thr, "n_params_partrain": p0["n_params"],
           "n_params_pytorch": q0["n_params"], "flops_per_step": p0["flops_per_step"],
           "same_work": same, "rounds": len(ratios), "partrain_ms": round(pms, 1),
           "pytorch_ms": round(qms, 1), "speedup": round(qms / pms, 3),
           "round_ratios": [round(x, 2) for x in ratios], "partrain_best_ms": round(pbest, 1),
           "pytorch_best_ms": round(qbest, 1), "best_ratio": round(qbest / pbest, 3),
           "partrain_tokens_per_s": round(p0["B"] * p0["T"] / (pms / 1e3), 1),
           "pytorch_tokens_per_s": round(q0["B_per_rank"] * q0["T"] / (qms / 1e3), 1),
           "partrain_gflops": round(gf, 1), "pytorch_gflops": round(qgf, 1),
           "sgemm_peak_gflops": round(peak, 1), "partrain_peak_fraction": round(gf / peak, 3),
           "pytorch_peak_fraction": round(qgf / peak, 3),
           "partrain_best_peak_fraction": round(p0["flops_per_step"] / (pbest / 1e3) / 1e9 /
                                                max(r["sgemm_peak_gflops"] for r in pa), 3)}
    shares = [r["cpu_share"] for r in pa if "cpu_share" in r]
    row["partrain_cpu_share"] = round(statistics.median(shares), 3) if shares else None
    loads = [r["load1"] for r in pa + py if "load1" in r]
    row["load1_range"] = [min(loads), max(loads)] if loads else None
    out.append(row)
    rr = "%.2f-%.2f" % (ratios[0], ratios[-1]) if ratios else "-"
    cpu = "%4.0f%%" % (100 * row["partrain_cpu_share"]) if shares else "    -"
    ld = "%.1f-%.1f" % tuple(row["load1_range"]) if loads else "-"
    print("%-6s %3d %11.1f %10.1f %6.2fx %12s %6.0f/%-6.0f %9.2fx %7.1f %13.1f %10.1f %5.1f%% %5s %9s" % (
        cfg, thr, pms, qms, qms / pms, rr, pbest, qbest, qbest / pbest, gf, qgf, peak,
        100 * gf / peak, cpu, ld))
first = out[0]["threads"] if out else None
print("# best_ms: partrain/pytorch fastest single step over all runs; %peak: partrain GFLOP/s at "
      "its median step / median measured sgemm peak (same threads); cpu%: partrain's CPU time / "
      "(wall x threads), median (below 100%: neighbours had the cores); load: 1-min load average "
      "before the runs")
print("# params (partrain = pytorch): " + ", ".join(
    "%s %d%s" % (r["config"], r["n_params_partrain"],
                 "" if r["n_params_partrain"] == r["n_params_pytorch"] else
                 " != %d" % r["n_params_pytorch"])
    for r in out if r["threads"] == first))
print("# FLOPs/step (same count for both, attention over the full T^2): " + ", ".join(
    "%s %.2f G" % (r["config"], r["flops_per_step"] / 1e9) for r in out if r["threads"] == first))
for r in out:
    print("RESULT " + json.dumps(r))
