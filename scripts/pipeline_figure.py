#!/usr/bin/env python3
"""Draw pipeline schedules from real runs' Chrome traces (log.trace) as one SVG.

    pipeline_figure.py --out FIG.svg [--step N] TRACE[=TITLE] ...

Each trace is one panel: a row per pipeline stage (the trace's pid is the
world rank; with dp = tp = 1 it is the stage), one box per pass of the step
(the trainer's "pipeline" events: F<mb>, B<mb>, W<mb>, BW<mb>, with " c<k>"
for chunk k), coloured by pass, on one time axis shared by the panels (the longest step fills the width). The step
drawn is --step (default: the last one in each trace). Standard library
only, so that it runs wherever the tests do.
"""
import argparse
import json
import re
import sys

COLOURS = {"F": "#4C78A8", "B": "#E45756", "W": "#54A24B", "BW": "#B279A2"}
PASS = re.compile(r"^(BW|F|B|W)(\d+)(?: c(\d+))?$")


def load(path):
    doc = json.load(open(path))
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    return [e for e in events if e.get("ph") == "X" and e.get("cat") == "pipeline"]


def panel(events, step):
    steps = sorted({e["args"]["step"] for e in events})
    if not steps:
        raise SystemExit("no pipeline events in the trace (a run with parallel.pp > 1 and log.trace)")
    s = step if step is not None else steps[-1]
    ev = [e for e in events if e["args"]["step"] == s]
    t0 = min(e["ts"] for e in ev)
    t1 = max(e["ts"] + e["dur"] for e in ev)
    rows = sorted({e["pid"] for e in ev})
    boxes = []
    for e in ev:
        m = PASS.match(e["name"])
        if not m:
            continue
        boxes.append((rows.index(e["pid"]), e["ts"] - t0, e["dur"], m.group(1), int(m.group(2)),
                      int(m.group(3) or 0)))
    return s, t1 - t0, len(rows), boxes


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--step", type=int)
    ap.add_argument("traces", nargs="+")
    a = ap.parse_args()
    W, ROW, GAP, LEFT = 900, 22, 46, 70
    parts, y = [], 10
    panels = []
    for spec in a.traces:
        path, _, title = spec.partition("=")
        panels.append((path, title) + panel(load(path), a.step))
    # one time axis for every panel, so that the steps compare by length
    longest = max(p[3] for p in panels)
    scale = (W - LEFT - 10) / longest if longest > 0 else 1
    for path, title, step, span, nrows, boxes in panels:
        parts.append('<text x="4" y="%d" font-size="13" font-weight="bold">%s (step %d, %.1f ms)</text>'
                     % (y + 13, title or path, step, span / 1e3))
        y += 20
        for r in range(nrows):
            parts.append('<text x="4" y="%d" font-size="11">stage %d</text>' % (y + r * ROW + 15, r))
        for row, ts, dur, kind, mb, chunk in boxes:
            x, w = LEFT + ts * scale, max(dur * scale, 0.5)
            op = 1.0 if chunk == 0 else 0.55
            parts.append('<rect x="%.1f" y="%d" width="%.1f" height="%d" fill="%s" fill-opacity="%.2f" '
                         'stroke="white" stroke-width="0.5"/>' % (x, y + row * ROW, w, ROW - 3,
                                                                 COLOURS[kind], op))
            if w > 14:
                parts.append('<text x="%.1f" y="%d" font-size="9" fill="white" text-anchor="middle">'
                             '%d</text>' % (x + w / 2, y + row * ROW + 13, mb))
        y += nrows * ROW + GAP - 20
    ly = y + 4
    for i, (k, c) in enumerate(COLOURS.items()):
        name = {"F": "forward", "B": "input gradient (B)", "W": "weight gradient (W)",
                "BW": "backward (B+W)"}[k]
        parts.append('<rect x="%d" y="%d" width="12" height="12" fill="%s"/>' % (LEFT + 170 * i, ly, c))
        parts.append('<text x="%d" y="%d" font-size="11">%s</text>' % (LEFT + 170 * i + 16, ly + 10, name))
    parts.append('<text x="%d" y="%d" font-size="11">lighter: second chunk; numbers: micro-batch</text>'
                 % (LEFT, ly + 28))
    H = ly + 40
    with open(a.out, "w") as f:
        f.write('<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" '
                'font-family="sans-serif">\n<rect width="100%%" height="100%%" fill="white"/>\n' % (W, H))
        f.write("\n".join(parts))
        f.write("\n</svg>\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
