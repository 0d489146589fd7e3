// Opens a partrain report in headless Chromium and checks what a person
// would see: every chart drawn, with its axes' tick labels and a non-empty
// series, ink on its canvas; no console error or uncaught exception; no
// request beyond the file itself. Node with no package: Chromium's DevTools
// protocol over a pipe (--remote-debugging-pipe: fd 3 to the browser, fd 4
// from it, messages ending in a NUL byte).
//
//   node report_browser.js REPORT.html [--screenshot OUT.png] [--same-loss TOL]
//                          [--chromium PATH]
//
// --same-loss TOL: the page's runs all have the loss of its first run at
// every step they share, within TOL relative (layouts that compute the same
// math: the parity the report shows).
//
// Prints one JSON object (the findings, the render time and the file's
// size) and exits 0 when every check holds, 1 otherwise, 77 when the
// browser cannot start (the test is then skipped, saying why).
"use strict";
const { spawn } = require("child_process");
const fs = require("fs");
const os = require("os");
const path = require("path");

const argv = process.argv.slice(2);
let file = null, shot = null, sameLoss = null, chrome = process.env.PT_CHROMIUM || "/usr/bin/chromium";
for (let i = 0; i < argv.length; i++) {
  if (argv[i] === "--screenshot") shot = argv[++i];
  else if (argv[i] === "--same-loss") sameLoss = Number(argv[++i]);
  else if (argv[i] === "--chromium") chrome = argv[++i];
  else file = argv[i];
}
if (!file) {
  console.error("usage: node report_browser.js REPORT.html [--screenshot OUT.png]");
  process.exit(2);
}
file = path.resolve(file);
const profile = fs.mkdtempSync(path.join(os.tmpdir(), "pt-chromium-"));
const flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
  "--disable-background-networking", "--disable-component-update", "--disable-sync",
  "--disable-extensions", "--disable-default-apps", "--mute-audio", "--hide-scrollbars",
  "--window-size=1280,900", "--user-data-dir=" + profile, "--remote-debugging-pipe", "about:blank"];
const proc = spawn(chrome, flags, { stdio: ["ignore", "ignore", "pipe", "pipe", "pipe"] });
let stderr = "";
proc.stderr.on("data", (d) => { stderr += d; });

const found = { console: [], exceptions: [], requests: [], log: [] };
let nextId = 1, buf = Buffer.alloc(0);
const pending = new Map(), waiters = [];

function send(method, params, sessionId) {
  const id = nextId++;
  const msg = { id, method, params: params || {} };
  if (sessionId) msg.sessionId = sessionId;
  proc.stdio[3].write(JSON.stringify(msg) + "\0");
  return new Promise((resolve, reject) => pending.set(id, { resolve, reject, method }));
}
function waitFor(method, ms) {
  return new Promise((resolve, reject) => {
    const w = { method, resolve };
    waiters.push(w);
    setTimeout(() => reject(new Error("timed out waiting for " + method)), ms);
  });
}
function onMessage(m) {
  if (m.id && pending.has(m.id)) {
    const p = pending.get(m.id);
    pending.delete(m.id);
    if (m.error) p.reject(new Error(p.method + ": " + m.error.message));
    else p.resolve(m.result);
    return;
  }
  const prm = m.params || {};
  if (m.method === "Runtime.consoleAPICalled" && (prm.type === "error" || prm.type === "assert"))
    found.console.push(prm.args.map((a) => a.value !== undefined ? a.value : a.description).join(" "));
  else if (m.method === "Runtime.exceptionThrown")
    found.exceptions.push(prm.exceptionDetails.exception ? prm.exceptionDetails.exception.description : prm.exceptionDetails.text);
  else if (m.method === "Log.entryAdded" && prm.entry.level === "error")
    found.log.push(prm.entry.source + ": " + prm.entry.text);
  else if (m.method === "Network.requestWillBeSent") {
    const url = prm.request.url;
    if (!url.startsWith("file:") && !url.startsWith("data:") && url !== "about:blank") found.requests.push(url);
  }
  for (let i = 0; i < waiters.length; i++)
    if (waiters[i].method === m.method) { waiters.splice(i, 1)[0].resolve(prm); break; }
}
proc.stdio[4].on("data", (d) => {
  buf = Buffer.concat([buf, d]);
  let k;
  while ((k = buf.indexOf(0)) >= 0) {
    const text = buf.slice(0, k).toString("utf8");
    buf = buf.slice(k + 1);
    try { onMessage(JSON.parse(text)); } catch (e) { /* not ours */ }
  }
});

// What the page shows, read in the page: for each chart its series' finite
// values, its axes' tick labels, and the coloured pixels of its plot area
// (the series are coloured, the grid and axes grey).
const CHECK = `(() => {
  const R = window.PT_REPORT || {};
  const out = { ready: !!R.ready, script_ms: R.ms, errors: R.errors || [], figures: document.querySelectorAll("figure.chart").length, charts: [] };
  for (const c of R.charts || []) {
    const u = c.plot;
    const series = u.series.slice(1).map((s, i) => ({ label: s.label, values: (u.data[i + 1] || []).filter((v) => v !== null && v !== undefined && isFinite(v)).length }));
    const axes = u.axes.map((a) => ({ show: a.show !== false, ticks: (a._values || []).filter((v) => v !== "" && v !== null && v !== undefined).length }));
    const b = u.bbox, img = u.ctx.getImageData(b.left, b.top, b.width, b.height).data;
    let ink = 0;
    for (let i = 0; i < img.length; i += 4) {
      const mx = Math.max(img[i], img[i + 1], img[i + 2]), mn = Math.min(img[i], img[i + 1], img[i + 2]);
      if (img[i + 3] > 0 && mx - mn > 40) ink++;
    }
    const r = u.root.getBoundingClientRect();
    out.charts.push({ title: c.title, series, axes, ink, shown: r.width > 0 && r.height > 0 });
  }
  // the loss of every run against the first's, at the steps they share
  const runs = JSON.parse(document.getElementById("pt-data").textContent).runs;
  out.runs = runs.length;
  out.loss_rel_diff = 0;
  out.loss_shared = 0;
  for (const r of runs.slice(1)) {
    const at = new Map(runs[0].steps.step.map((s, i) => [s, runs[0].steps.loss[i]]));
    r.steps.step.forEach((s, i) => {
      if (!at.has(s)) return;
      const a = at.get(s), b = r.steps.loss[i];
      out.loss_shared++;
      out.loss_rel_diff = Math.max(out.loss_rel_diff, Math.abs(a - b) / Math.abs(a));
    });
  }
  return JSON.stringify(out);
})()`;

async function main() {
  const { targetInfos } = await send("Target.getTargets");
  let page = targetInfos.find((t) => t.type === "page");
  const targetId = page ? page.targetId : (await send("Target.createTarget", { url: "about:blank" })).targetId;
  const { sessionId } = await send("Target.attachToTarget", { targetId, flatten: true });
  for (const d of ["Runtime.enable", "Log.enable", "Network.enable", "Page.enable"]) await send(d, {}, sessionId);
  await send("Emulation.setDeviceMetricsOverride", { width: 1280, height: 900, deviceScaleFactor: 1, mobile: false }, sessionId);
  const t0 = Date.now();
  const loaded = waitFor("Page.loadEventFired", 30000);
  await send("Page.navigate", { url: "file://" + file }, sessionId);
  await loaded;
  let ready = false;
  while (!ready && Date.now() - t0 < 30000) {
    const r = await send("Runtime.evaluate", { expression: "!!(window.PT_REPORT && window.PT_REPORT.ready)", returnByValue: true }, sessionId);
    ready = r.result.value === true;
    if (!ready) await new Promise((res) => setTimeout(res, 20));
  }
  const render_ms = Date.now() - t0;
  const res = await send("Runtime.evaluate", { expression: CHECK, returnByValue: true }, sessionId);
  const page_ = JSON.parse(res.result.value);
  if (shot) {
    const m = await send("Page.getLayoutMetrics", {}, sessionId);
    const h = Math.min(Math.ceil((m.cssContentSize || m.contentSize).height), 6000);
    await send("Emulation.setDeviceMetricsOverride", { width: 1280, height: h, deviceScaleFactor: 1, mobile: false }, sessionId);
    const png = await send("Page.captureScreenshot", { format: "png", captureBeyondViewport: true }, sessionId);
    fs.writeFileSync(shot, Buffer.from(png.data, "base64"));
  }
  await send("Browser.close").catch(() => {});
  return { page: page_, render_ms };
}

function verdict(r) {
  const bad = [];
  const p = r.page;
  if (!p.ready) bad.push("the page never said it was drawn");
  if (p.errors.length) bad.push("the page's own errors: " + p.errors.join("; "));
  if (!p.charts.length) bad.push("no chart");
  if (p.figures !== p.charts.length) bad.push(p.figures + " chart boxes but " + p.charts.length + " charts drawn");
  for (const c of p.charts) {
    if (!c.shown) bad.push(c.title + ": not shown");
    if (c.axes.length < 2 || c.axes.some((a) => !a.show || a.ticks === 0)) bad.push(c.title + ": an axis without tick labels");
    if (!c.series.length || c.series.some((s) => s.values === 0)) bad.push(c.title + ": an empty series");
    if (c.ink < 50) bad.push(c.title + ": nothing drawn (" + c.ink + " coloured pixels)");
  }
  if (sameLoss !== null && (p.runs < 2 || !p.loss_shared || !(p.loss_rel_diff <= sameLoss)))
    bad.push("the runs' loss curves differ: " + p.loss_rel_diff + " relative at most over " +
             p.loss_shared + " shared steps (tolerance " + sameLoss + ")");
  for (const e of found.console) bad.push("console error: " + e);
  for (const e of found.exceptions) bad.push("exception: " + e);
  for (const e of found.log) bad.push("browser error: " + e);
  for (const u of found.requests) bad.push("network request: " + u);
  return bad;
}

const timer = setTimeout(() => {
  console.log(JSON.stringify({ ok: false, error: "timed out", stderr: stderr.slice(-2000) }));
  proc.kill("SIGKILL");
  process.exit(1);
}, 60000);
proc.on("error", (e) => {
  console.log(JSON.stringify({ ok: false, skip: "cannot start " + chrome + ": " + e.message }));
  process.exit(77);
});
main().then((r) => {
  clearTimeout(timer);
  const bad = verdict(r);
  const out = {
    ok: bad.length === 0, problems: bad, render_ms: r.render_ms, script_ms: r.page.script_ms,
    bytes: fs.statSync(file).size, runs: r.page.runs, loss_rel_diff: r.page.loss_rel_diff, charts: r.page.charts.map((c) => ({ title: c.title, series: c.series.length, ink: c.ink }))
  };
  console.log(JSON.stringify(out));
  finish(bad.length ? 1 : 0);
}).catch((e) => {
  clearTimeout(timer);
  console.log(JSON.stringify({ ok: false, error: e.message, stderr: stderr.slice(-2000) }));
  finish(1);
});

// The browser gone (closed, else killed), then its profile removed.
function finish(code) {
  const done = () => {
    try { fs.rmSync(profile, { recursive: true, force: true }); } catch (e) { /* left in /tmp */ }
    process.exit(code);
  };
  if (proc.exitCode !== null || proc.signalCode !== null) return done();
  proc.on("exit", done);
  setTimeout(() => proc.kill("SIGKILL"), 3000);
}
