#!/usr/bin/env python3
"""Loss-vs-step and loss-vs-time plots of data-parallel runs, as SVG written by
hand (no matplotlib). Reads partrain metrics (JSON lines): step lines give the
training loss (drawn smoothed, EMA 0.9) and step_ms (cumulated for the time
axis), validation lines give val_loss (drawn as markers joined by lines).

    scripts/plot_dp.py OUT.svg NAME=runs/dp/sync.jsonl NAME=... [--title T]
"""
import json
import sys

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]


def load(path):
    steps, val, t = [], [], 0.0
    for line in open(path):
        r = json.loads(line)
        if "val_loss" in r:
            val.append((r["step"], t, r["val_loss"]))
        elif "loss" in r:
            t += r["step_ms"] / 1e3
            steps.append((r["step"], t, r["loss"]))
    ema, sm = None, []
    for s, tt, l in steps:
        ema = l if ema is None else 0.9 * ema + 0.1 * l
        sm.append((s, tt, ema))
    return sm, val


def panel(x0, y0, w, h, series, xi, xlabel, ylo, yhi, title):
    xmax = max(p[xi] for _, sm, val in series for p in sm + val) or 1
    out = [f'<g font-family="sans-serif" font-size="11">',
           f'<rect x="{x0}" y="{y0}" width="{w}" height="{h}" fill="none" stroke="#444"/>',
           f'<text x="{x0 + w / 2}" y="{y0 - 8}" text-anchor="middle" font-size="13">{title}</text>',
           f'<text x="{x0 + w / 2}" y="{y0 + h + 32}" text-anchor="middle">{xlabel}</text>',
           f'<text x="{x0 - 40}" y="{y0 + h / 2}" text-anchor="middle" '
           f'transform="rotate(-90 {x0 - 40} {y0 + h / 2})">loss</text>']

    def X(v):
        return x0 + w * v / xmax

    def Y(v):
        v = min(max(v, ylo), yhi)
        return y0 + h - h * (v - ylo) / (yhi - ylo)

    for k in range(6):
        v = ylo + (yhi - ylo) * k / 5
        out.append(f'<line x1="{x0}" x2="{x0 + w}" y1="{Y(v):.1f}" y2="{Y(v):.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{x0 - 5}" y="{Y(v) + 4:.1f}" text-anchor="end">{v:.2f}</text>')
        xv = xmax * k / 5
        out.append(f'<text x="{X(xv):.1f}" y="{y0 + h + 15}" text-anchor="middle">{xv:.0f}</text>')
    for i, (name, sm, val) in enumerate(series):
        c = COLORS[i % len(COLORS)]
        pts = " ".join(f"{X(p[xi]):.1f},{Y(p[2]):.1f}" for p in sm)
        out.append(f'<polyline points="{pts}" fill="none" stroke="{c}" stroke-width="1" opacity="0.5"/>')
        pts = " ".join(f"{X(p[xi]):.1f},{Y(p[2]):.1f}" for p in val)
        out.append(f'<polyline points="{pts}" fill="none" stroke="{c}" stroke-width="2"/>')
        for p in val:
            out.append(f'<circle cx="{X(p[xi]):.1f}" cy="{Y(p[2]):.1f}" r="2.5" fill="{c}"/>')
    out.append("</g>")
    return out


def main():
    args = sys.argv[1:]
    title = "dp=2 on the default dataset"
    if "--title" in args:
        i = args.index("--title")
        title = args[i + 1]
        del args[i:i + 2]
    out_path, runs = args[0], args[1:]
    series = []
    for spec in runs:
        name, path = spec.split("=", 1)
        sm, val = load(path)
        series.append((name, sm, val))
    vals = [p[2] for _, sm, val in series for p in val[1:]] + [p[2] for _, sm, _ in series for p in sm[len(sm) // 10:]]
    ylo, yhi = min(vals) - 0.05, max(vals) + 0.05
    W, H = 980, 420
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}">',
           '<rect width="100%" height="100%" fill="white"/>',
           f'<text x="{W / 2}" y="20" text-anchor="middle" font-family="sans-serif" font-size="15">{title}: '
           'validation loss (thick, markers) and training loss (thin, EMA 0.9)</text>']
    svg += panel(70, 50, 380, 300, series, 0, "step", ylo, yhi, "loss vs step")
    svg += panel(540, 50, 380, 300, series, 1, "seconds (sum of step times)", ylo, yhi, "loss vs time")
    for i, (name, _, val) in enumerate(series):
        c = COLORS[i % len(COLORS)]
        x = 70 + 160 * i
        last = f" {val[-1][2]:.3f}" if val else ""
        svg.append(f'<rect x="{x}" y="{H - 28}" width="12" height="12" fill="{c}"/>')
        svg.append(f'<text x="{x + 16}" y="{H - 18}" font-family="sans-serif" font-size="11">{name}{last}</text>')
    svg.append("</svg>")
    open(out_path, "w").write("\n".join(svg) + "\n")


if __name__ == "__main__":
    main()
