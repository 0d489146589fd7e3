/* partrain report: draws the runs of the page's data (the JSON in
 * #pt-data, written by src/report/report_data.c) with uPlot (vendored,
 * inlined before this script). Hand-written, no dependency beyond uPlot; it
 * computes nothing the C side could: it lays out sections, tables and
 * charts. Every chart is listed in window.PT_REPORT.charts ({title, plot})
 * and window.PT_REPORT.ready is set once all are drawn (the browser test,
 * tests/cli/test_report_browser.js, reads both). A chart that fails says so
 * in its place and on the console; the others still draw. */
(function () {
  "use strict";
  var t0 = performance.now();
  var STATE = { charts: [], ready: false, ms: 0, errors: [] };
  window.PT_REPORT = STATE;
  var DATA = JSON.parse(document.getElementById("pt-data").textContent);
  var RUNS = DATA.runs || [];
  var root = document.getElementById("report");

  var RUN_COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b"];
  var PART_COLORS = {
    compute: "#4e79a7", dp: "#f28e2b", tp: "#e15759", pp: "#76b7b2", zero: "#59a14f",
    optimizer: "#edc948", other: "#bab0ac"
  };
  var PART_LABELS = {
    compute: "compute", dp: "dp comm (exposed)", tp: "tp comm (exposed)",
    pp: "pp wait + comm", zero: "ZeRO comm (exposed)", optimizer: "optimizer", other: "other"
  };
  var MEM_COLORS = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#bab0ac"];
  var W = 560, H = 250;

  /* ---- small helpers ---- */
  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }
  function add(parent, child) { parent.appendChild(child); return child; }
  function color(i) { return RUN_COLORS[i % RUN_COLORS.length]; }
  function finite(v) { return typeof v === "number" && isFinite(v); }
  function fmt(v, digits) {
    if (!finite(v)) return "–";
    var a = Math.abs(v);
    if (a >= 1e5) return v.toExponential(2);
    return v.toFixed(digits === undefined ? (a >= 100 ? 0 : a >= 10 ? 1 : a >= 1 ? 2 : 4) : digits);
  }
  function bytes(v) {
    if (!finite(v)) return "–";
    var u = ["B", "KiB", "MiB", "GiB", "TiB"], k = 0;
    while (Math.abs(v) >= 1024 && k < u.length - 1) { v /= 1024; k++; }
    return v.toFixed(k ? 1 : 0) + " " + u[k];
  }
  function get(o, path) {
    var parts = path.split(".");
    for (var i = 0; i < parts.length; i++) {
      if (o === null || typeof o !== "object") return undefined;
      o = o[parts[i]];
    }
    return o;
  }
  function median(a) {
    var v = a.filter(finite).sort(function (x, y) { return x - y; });
    return v.length ? v[Math.floor(v.length / 2)] : NaN;
  }
  function last(a) {
    for (var i = a.length - 1; i >= 0; i--) if (finite(a[i])) return a[i];
    return NaN;
  }
  function section(title, intro) {
    var s = add(root, el("section"));
    add(s, el("h2", null, title));
    if (intro) add(s, el("p", "intro", intro));
    return add(s, el("div", "grid"));
  }
  function table(parent, head, rows) {
    var t = add(parent, el("table"));
    var tr = add(add(t, el("thead")), el("tr"));
    head.forEach(function (h) { add(tr, el("th", null, h)); });
    var tb = add(t, el("tbody"));
    rows.forEach(function (r) {
      var row = add(tb, el("tr"));
      r.forEach(function (c) {
        var td = add(row, el("td"));
        if (c instanceof Node) td.appendChild(c); else td.textContent = c;
      });
    });
    return t;
  }

  /* A chart in its own box: make() builds the uPlot options and data; a
   * failure is shown in place and logged, the other charts go on. */
  function chart(parent, title, note, make) {
    var box = add(parent, el("figure", "chart"));
    add(box, el("figcaption", null, title));
    var host = add(box, el("div", "plot"));
    if (note) add(box, el("p", "note", note));
    try {
      var spec = make();
      var opts = Object.assign({ width: W, height: H, legend: { live: true } }, spec.opts);
      var plot = new uPlot(opts, spec.data, host);
      STATE.charts.push({ title: title, plot: plot });
    } catch (e) {
      host.appendChild(el("p", "error", "this chart could not be drawn: " + e.message));
      STATE.errors.push(title + ": " + e.message);
      console.error("partrain report: " + title + ": " + e.message);
    }
  }

  /* a tick label: three significant digits, exponents outside [0.01, 1e5) */
  function tick(v) {
    if (v === 0) return "0";
    var a = Math.abs(v);
    if (a >= 1e5 || a < 1e-2) return v.toExponential(1);
    return String(+v.toPrecision(3));
  }
  function ticks(u, splits) { return splits.map(tick); }

  function axes(xlabel, ylabel, yvalues, xvalues) {
    var ax = [{ label: xlabel, stroke: "#333", grid: { stroke: "#eee" }, values: ticks },
              { label: ylabel, stroke: "#333", grid: { stroke: "#eee" }, size: 60, values: ticks }];
    if (yvalues) ax[1].values = yvalues;
    if (xvalues) { ax[0].values = xvalues.values; ax[0].splits = xvalues.splits; }
    return ax;
  }

  /* Line chart of series over x: items [{label, x, y, color, dash, points}];
   * their x values are merged (uPlot.join), gaps spanned. */
  function lines(items, xlabel, ylabel, logy) {
    var tables = items.map(function (it) { return [it.x, it.y]; });
    var data = uPlot.join(tables);
    var series = [{ label: xlabel }];
    items.forEach(function (it) {
      series.push({
        label: it.label, stroke: it.color, width: it.width || 1.5, dash: it.dash,
        spanGaps: true, points: { show: !!it.points, size: 5, fill: it.color }
      });
    });
    return {
      data: data,
      opts: {
        scales: { x: { time: false }, y: logy ? { distr: 3 } : {} },
        series: series, axes: axes(xlabel, ylabel)
      }
    };
  }

  /* Category axis: labels at 0..n-1 */
  function categories(labels) {
    return {
      splits: function () { return labels.map(function (_, i) { return i; }); },
      values: function (u, splits) {
        return splits.map(function (v) { return labels[v] === undefined ? "" : labels[v]; });
      }
    };
  }

  /* Stacked bars: one bar per category, stacks [{label, values, color}] from
   * the bottom. uPlot draws series in order, so each series is the stack's
   * cumulative height, the tallest first, each painted over by the ones
   * below it; the legend shows the part's own value. */
  function stacked(labels, stacks, ylabel, yvalues, xlabel) {
    var n = labels.length, cum = [], run = labels.map(function () { return 0; });
    stacks.forEach(function (s) {
      run = run.map(function (v, i) { return v + (finite(s.values[i]) ? s.values[i] : 0); });
      cum.push(run.slice());
    });
    var x = labels.map(function (_, i) { return i; });
    var data = [x], series = [{ label: xlabel || "" }];
    var bars = uPlot.paths.bars({ size: [0.6, 80] });
    for (var k = stacks.length - 1; k >= 0; k--) {
      (function (s) {
        data.push(cum[k]);
        series.push({
          label: s.label, fill: s.color, stroke: s.color, paths: bars, points: { show: false },
          value: function (u, v, si, i) { return i == null ? "" : (yvalues ? yvalues(s.values[i]) : fmt(s.values[i])); }
        });
      })(stacks[k]);
    }
    return {
      data: data,
      opts: {
        scales: { x: { time: false, range: [-0.5, n - 0.5] }, y: { range: function (u, lo, hi) { return [0, hi * 1.08 || 1]; } } },
        series: series,
        axes: axes(xlabel || "", ylabel, yvalues ? function (u, sp) { return sp.map(yvalues); } : null, categories(labels))
      }
    };
  }

  /* Side-by-side bars per category: groups [{label, values, color}] */
  function grouped(labels, groups, ylabel) {
    var n = labels.length, x = labels.map(function (_, i) { return i; });
    var data = [x], series = [{ label: "" }], k = groups.length;
    groups.forEach(function (g, j) {
      data.push(g.values.map(function (v) { return finite(v) ? v : null; }));
      series.push({
        label: g.label, fill: g.color, stroke: g.color, points: { show: false },
        paths: uPlot.paths.bars({ size: [0.7 / k, 60], align: k == 1 ? 0 : j == 0 ? -1 : 1 })
      });
    });
    return {
      data: data,
      opts: {
        scales: { x: { time: false, range: [-0.5, n - 0.5] }, y: { range: function (u, lo, hi) { return [0, hi * 1.1 || 1]; } } },
        series: series, axes: axes("", ylabel, null, categories(labels))
      }
    };
  }

  /* ---- the sections ---- */
  function header() {
    add(root, el("h1", null, "partrain report"));
    var p = add(root, el("p", "meta"));
    p.textContent = RUNS.map(function (r) { return r.name; }).join(" · ") + " — " + (DATA.generator || "");
  }

  function summary() {
    var g = section("Runs", "One row per run; colours are the same in every chart.");
    var rows = RUNS.map(function (r, i) {
      var sw = el("span", "swatch"); sw.style.background = color(i);
      var name = el("span"); name.appendChild(sw); name.appendChild(document.createTextNode(r.name));
      var pred = get(r.record, "plan.predicted.step_ms");
      return [name, r.layout || "–", String(r.world || "–"), String(r.steps.step.length ? last(r.steps.step) : 0),
              fmt(last(r.steps.loss), 4), fmt(last(r.val.loss), 4), fmt(median(r.steps.tokens_per_s), 0),
              fmt(median(r.steps.step_ms), 1), finite(pred) ? fmt(pred, 1) : "not planned"];
    });
    table(g, ["run", "layout", "ranks", "steps", "loss", "val loss", "tokens/s (median)",
              "step ms (median)", "predicted step ms"], rows);
    RUNS.forEach(function (r, i) {
      if (!r.notes || !r.notes.length) return;
      var box = add(g, el("div", "notes"));
      add(box, el("strong", null, r.name + ": what is missing"));
      var ul = add(box, el("ul"));
      r.notes.forEach(function (n) { add(ul, el("li", null, n)); });
    });
  }

  function runsLines(key, xkey, label) {
    return RUNS.map(function (r, i) {
      return { label: r.name + (label ? " " + label : ""), x: r.steps[xkey], y: r.steps[key], color: color(i) };
    }).filter(function (it) { return it.y.some(finite) && it.x.some(finite); });
  }

  function lossCharts() {
    var g = section("Loss", "Training loss (the mean over the global batch, each step) and validation loss (dashed, dots). " +
                    "Layouts that compute the same math follow the same curve.");
    [["step", "step", "val.step"], ["elapsed_s", "time (s)", "val.elapsed_s"]].forEach(function (ax) {
      var items = [];
      RUNS.forEach(function (r, i) {
        items.push({ label: r.name + " train", x: r.steps[ax[0]], y: r.steps.loss, color: color(i) });
        var vx = get(r, ax[2]);
        if (r.val.loss.length && vx.some(finite))
          items.push({ label: r.name + " val", x: vx, y: r.val.loss, color: color(i), dash: [6, 4], points: true, width: 2 });
      });
      items = items.filter(function (it) { return it.y.some(finite) && it.x.some(finite); });
      if (!items.length) return;
      var note = ax[0] === "elapsed_s" && RUNS.some(function (r) { return r.elapsed === "steps"; })
        ? "Runs without elapsed times (older ones): the sum of their step times." : null;
      chart(g, "Loss against " + (ax[0] === "step" ? "step" : "time"), note, function () {
        return lines(items, ax[1], "loss");
      });
    });
  }

  function trainingCharts() {
    var g = section("Training", "Throughput, schedule and gradient of every step.");
    [["tokens_per_s", "tokens/s"], ["lr", "learning rate"], ["grad_norm", "gradient norm (before clipping)"]].forEach(function (c) {
      var items = runsLines(c[0], "step");
      if (items.length) chart(g, c[1][0].toUpperCase() + c[1].slice(1), null, function () { return lines(items, "step", c[1]); });
    });
    var items = runsLines("step_ms", "step", "measured");
    RUNS.forEach(function (r, i) {
      var p = get(r.record, "plan.predicted.step_ms");
      if (finite(p) && r.steps.step.length)
        items.push({ label: r.name + " predicted", x: [r.steps.step[0], last(r.steps.step)], y: [p, p], color: color(i), dash: [3, 3], width: 2 });
    });
    if (items.length)
      chart(g, "Step time: measured and predicted", "The prediction is the planner's (train --plan or --layout auto), dashed.",
            function () { return lines(items, "step", "ms"); });
  }

  function partsTable(parent, r) {
    var p = r.parts, rows = [];
    p.names.forEach(function (n, k) {
      if (!(p.max[k] > 0)) return;
      rows.push([PART_LABELS[n] || n, fmt(p.min[k], 2), fmt(p.mean[k], 2), fmt(p.max[k], 2)]);
    });
    rows.push(["step", fmt(p.step.min, 2), fmt(p.step.mean, 2), fmt(p.step.max, 2)]);
    var t = table(parent, ["part (ms, mean over " + p.steps + " steps)", "min over ranks", "mean", "max over ranks"], rows);
    t.className = "parts";
    if (p.ranks && p.ranks.length > 1 && p.slowest && p.slowest.some(function (v) { return v > 0; })) {
      var most = 0;
      p.slowest.forEach(function (v, q) { if (v > p.slowest[most]) most = q; });
      add(parent, el("p", "note", "Slowest rank most often: rank " + most + " (" + p.slowest[most] + " of " + p.steps + " steps)."));
    }
  }

  function timeCharts() {
    var with_parts = RUNS.filter(function (r) { return r.parts; });
    if (!with_parts.length) return;
    var g = section("Where the time went",
      "Each rank's step time split into disjoint parts that add up to it: the passes' own work (compute), " +
      "the time its thread was blocked on each group's communication (exposed; pp also holds the waits for " +
      "neighbour stages), the optimizer's update, and the rest. Means over the steps after the first.");
    with_parts.forEach(function (r) {
      var p = r.parts, names = p.names;
      var used = names.filter(function (n, k) { return p.max[k] > 0 || n === "compute"; });
      if (p.ranks) {
        var labels = p.ranks.map(function (_, q) { return "rank " + q; });
        var stacks = used.map(function (n) {
          var k = names.indexOf(n);
          return { label: PART_LABELS[n] || n, color: PART_COLORS[n], values: p.ranks.map(function (row) { return row[k]; }) };
        });
        chart(g, r.name + ": step time per rank, by part", null, function () { return stacked(labels, stacks, "ms", null, "rank"); });
      } else {
        chart(g, r.name + ": step time by part, over the ranks", "More than 64 ranks: min, mean and max over them.", function () {
          return grouped(used.map(function (n) { return PART_LABELS[n] || n; }), ["min", "mean", "max"].map(function (w, j) {
            return { label: w, color: RUN_COLORS[j], values: used.map(function (n) { return p[w][names.indexOf(n)]; }) };
          }), "ms");
        });
      }
      var box = add(g, el("div", "side"));
      add(box, el("h3", null, r.name));
      partsTable(box, r);
      var loop = r.loop, lines_ = [];
      if (loop.nval) lines_.push(loop.nval + " validation" + (loop.nval > 1 ? "s" : "") + ": " + fmt(loop.val_ms / 1e3, 1) + " s in all");
      if (loop.nsaves) lines_.push(loop.nsaves + " checkpoint save" + (loop.nsaves > 1 ? "s" : "") + ": " + fmt(loop.save_ms / 1e3, 1) + " s in all");
      if (lines_.length) add(box, el("p", "note", "Outside the steps: " + lines_.join("; ") + "."));
      predictedBreakdown(g, r);
    });
  }

  /* The planner's breakdown beside the measured parts' means */
  function predictedBreakdown(g, r) {
    var b = get(r.record, "plan.predicted.breakdown");
    if (!b || !r.parts) return;
    var p = r.parts, m = function (n) { return p.mean[p.names.indexOf(n)]; };
    var labels = ["compute", "pipeline", "tp", "dp + ZeRO", "optimizer", "other"];
    var measured = [m("compute"), m("pp"), m("tp"), m("dp") + m("zero"), m("optimizer"), m("other")];
    var predicted = [b.compute_ms, b.bubble_ms + b.pp_ms, b.tp_ms, b.dp_ms, b.optim_ms, 0];
    chart(g, r.name + ": predicted against measured, by part", "Measured: the mean over the ranks; predicted: the planner's step.",
          function () {
            return grouped(labels, [{ label: "measured", color: "#4e79a7", values: measured },
                                    { label: "predicted", color: "#f28e2b", values: predicted }], "ms");
          });
  }

  function pipelineCharts() {
    var pp = RUNS.filter(function (r) { return r.steps.bubble.some(finite); });
    if (!pp.length) return;
    var g = section("Pipeline", "The bubble: the share of the passes' span a stage is not working, mean over the ranks, " +
                    "beside the schedule's formula (pt_schedule_bubble at equal pass times).");
    var items = [];
    pp.forEach(function (r) {
      var i = RUNS.indexOf(r);
      items.push({ label: r.name + " measured", x: r.steps.step, y: r.steps.bubble, color: color(i) });
      if (finite(r.bubble_formula))
        items.push({ label: r.name + " formula", x: [r.steps.step[0], last(r.steps.step)], y: [r.bubble_formula, r.bubble_formula], color: color(i), dash: [6, 4], width: 2 });
    });
    chart(g, "Pipeline bubble", null, function () { return lines(items, "step", "bubble"); });
  }

  /* The profile's best bus bandwidth for a group's main operation at its size */
  function profileGbps(r, group) {
    var prof = get(r.record, "plan.profile.comm"), cfg = get(r.record, "config.parallel");
    if (!prof || !cfg) return NaN;
    var op = { dp: "allreduce", tp: "allreduce", pp: "p2p", zero: "reduce_scatter" }[group];
    var ranks = { dp: cfg.dp, tp: cfg.tp, pp: 2, zero: cfg.zero_group || cfg.dp }[group];
    var best = NaN;
    prof.forEach(function (c) {
      if (c.op === op && c.ranks === ranks && finite(c.gbps) && !(c.gbps <= best)) best = c.gbps;
    });
    return best;
  }

  function commCharts() {
    var runs = RUNS.filter(function (r) { return r.parts && Object.keys(r.parts.groups).length; });
    if (!runs.length) return;
    var g = section("Communication", "Bytes each rank sent per step on each group, the operations' time " +
                    "(from start to completion, on the caller or the progress lanes), the part of it that was hidden " +
                    "(overlapped) and the bandwidth achieved, beside the calibrated profile's best for that operation and group size.");
    runs.forEach(function (r) {
      var gs = Object.keys(r.parts.groups), rows = [];
      gs.forEach(function (k) {
        var x = r.parts.groups[k];
        rows.push([k, bytes(x.bytes), fmt(x.comm_ms, 2), fmt(x.overlap_ms, 2), fmt(x.gbps, 3), fmt(profileGbps(r, k), 3)]);
      });
      var box = add(g, el("div", "side"));
      add(box, el("h3", null, r.name));
      table(box, ["group", "bytes / step / rank", "comm ms", "overlapped ms", "achieved GB/s", "profile GB/s"], rows);
      chart(g, r.name + ": bandwidth per group", "Achieved: bytes over the operations' time; profile: partrain calibrate's.", function () {
        var groups = [{ label: "achieved", color: "#4e79a7", values: gs.map(function (k) { return r.parts.groups[k].gbps; }) }];
        var prof = gs.map(function (k) { return profileGbps(r, k); });
        if (prof.some(finite)) groups.push({ label: "profile", color: "#f28e2b", values: prof });
        return grouped(gs, groups, "GB/s");
      });
    });
  }

  function memoryCharts() {
    var runs = RUNS.filter(function (r) { return r.mem; });
    if (!runs.length) return;
    var g = section("Memory", "Each rank's peak bytes by category (the counting allocator's), the largest over the steps, " +
                    "beside the planner's prediction for a rank when the run was planned.");
    runs.forEach(function (r) {
      var m = r.mem, cats = m.names.filter(function (n) { return n !== "total"; });
      var rows = m.ranks ? m.ranks.slice() : [m.max];
      var labels = m.ranks ? m.ranks.map(function (_, q) { return "rank " + q; }) : ["max over ranks"];
      var pred = get(r.record, "plan.predicted.mem");
      if (pred) {
        rows.push(m.names.map(function (n) { return pred[n]; }));
        labels.push("predicted");
      }
      var stacks = cats.map(function (n, k) {
        return { label: n, color: MEM_COLORS[k % MEM_COLORS.length], values: rows.map(function (row) { return row[m.names.indexOf(n)]; }) };
      });
      chart(g, r.name + ": memory peak per rank, by category", null, function () {
        return stacked(labels, stacks, "bytes", bytes, "rank");
      });
    });
  }

  function details() {
    var g = section("Run details", "Layout, configuration, machine and version of each run, and its trace.");
    RUNS.forEach(function (r, i) {
      var box = add(g, el("div", "detail"));
      var h = add(box, el("h3", null, r.name));
      h.style.borderLeft = "6px solid " + color(i);
      var rec = r.record, rows = [["layout", r.layout || "–"], ["ranks", String(r.world || "–")]];
      if (rec) {
        rows.push(["version", rec.version || "–"], ["backend", rec.backend || "–"]);
        var m = rec.machine || {};
        rows.push(["CPU", (m.cpu || "–") + ", " + (m.cores || "?") + " cores, " + (m.threads || "?") + " threads a rank"]);
        rows.push(["kernels", (m.gemm || "–") + "; OpenBLAS " + (m.blas_core || "–")]);
        var plan = rec.plan;
        if (plan) {
          var pr = plan.predicted || {};
          rows.push(["plan", (plan.source || "") + ": " + (plan.layout || "") + ", " + fmt(pr.step_ms, 1) + " ms a step, " +
                     bytes(get(pr, "mem.total")) + " a rank"]);
          (plan.why || pr.why || []).forEach(function (w) { rows.push(["", w]); });
        }
      }
      var tr = r.trace;
      var link = el("span");
      if (tr) {
        var a = add(link, el("a", null, tr.path));
        a.href = "file://" + tr.path;
        link.appendChild(document.createTextNode(" (" + bytes(tr.bytes) + "): open it at "));
        var pf = add(link, el("a", null, "ui.perfetto.dev"));
        pf.href = "https://ui.perfetto.dev";
        pf.rel = "noreferrer";
        link.appendChild(document.createTextNode(" (Open trace file)."));
      } else {
        link.textContent = "none";
      }
      rows.push(["trace", link]);
      table(box, ["", ""], rows).className = "kv";
      if (rec && rec.config) {
        var d = add(box, el("details"));
        add(d, el("summary", null, "config (resolved)"));
        add(d, el("pre", null, JSON.stringify(rec.config, null, 2)));
      }
    });
  }

  header();
  if (!RUNS.length) add(root, el("p", "error", "No runs in this report."));
  [summary, lossCharts, trainingCharts, timeCharts, pipelineCharts, commCharts, memoryCharts, details].forEach(function (f) {
    try { f(); } catch (e) {
      STATE.errors.push(e.message);
      console.error("partrain report: " + e.message);
      add(root, el("p", "error", "part of this report could not be drawn: " + e.message));
    }
  });
  STATE.ms = performance.now() - t0;
  STATE.ready = true;
  document.body.setAttribute("data-ready", "1");
})();
