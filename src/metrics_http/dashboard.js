// Weir dashboard: polls /api/stats every second and draws everything by hand (canvas
// charts, DOM tables). No libraries, no external requests. Text from the server (error
// messages, names) is only ever set with textContent.
"use strict";

const POLL_MS = 1000;
const KEEP = 600; // samples: ten minutes at one a second
let samples = [];
let lastT = 0;
let rangeSecs = 300;
let rangeChosen = false; // until the user picks a range, it follows how much history there is
let hover = null; // { chart, t } while the mouse is over a chart

const COLORS = {
  blue: "#2f6fdf", teal: "#14a3a3", orange: "#e0812f", red: "#d64545",
  purple: "#7b56c6", green: "#1f9d55", grey: "#8a93a3",
};

// ---- formatting ----

function fmtInt(n) {
  return Math.round(n).toLocaleString("en-US");
}

function fmtRate(n) {
  if (n >= 100000) return (n / 1000).toFixed(0) + "k";
  if (n >= 10000) return (n / 1000).toFixed(1) + "k";
  if (n >= 100) return n.toFixed(0);
  if (n >= 10) return n.toFixed(1);
  return n.toFixed(n === 0 ? 0 : 2);
}

// Durations in the unit that keeps them readable: a queue wait of a few microseconds
// shows as "4 µs", not "0.00 ms".
function fmtMs(ms) {
  if (ms === 0) return "0";
  if (ms < 0.01) return (ms * 1000).toFixed(1) + " µs";
  if (ms < 1) return (ms * 1000).toFixed(0) + " µs";
  if (ms >= 10000) return (ms / 1000).toFixed(0) + " s";
  if (ms >= 1000) return (ms / 1000).toFixed(2) + " s";
  if (ms >= 100) return ms.toFixed(0) + " ms";
  if (ms >= 10) return ms.toFixed(1) + " ms";
  return ms.toFixed(2) + " ms";
}

function fmtDuration(secs) {
  secs = Math.floor(secs);
  const d = Math.floor(secs / 86400), h = Math.floor(secs % 86400 / 3600);
  const m = Math.floor(secs % 3600 / 60), s = secs % 60;
  if (d > 0) return `${d}d ${h}h`;
  if (h > 0) return `${h}h ${m}m`;
  if (m > 0) return `${m}m ${s}s`;
  return `${s}s`;
}

function fmtClock(ms) {
  const d = new Date(ms);
  return d.toLocaleTimeString("en-GB", { hour12: false });
}

function setFigure(id, value, text) {
  const el = document.getElementById(id);
  if (!el) return;
  el.dataset.value = String(value);
  el.textContent = text;
}

// ---- charts ----

function niceStep(max, ticks) {
  const raw = max / ticks;
  const mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const f = raw / mag;
  return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * mag;
}

const charts = {
  tps: {
    fmt: fmtRate,
    minTop: 1,
    series: [
      { key: "tps", name: "transactions", color: COLORS.blue },
      { key: "qps", name: "queries", color: COLORS.teal },
    ],
  },
  latency: {
    fmt: fmtMs,
    minTop: 1,
    series: [
      { key: "xact_avg_ms", name: "average", color: COLORS.blue },
      { key: "xact_p50_ms", name: "p50", color: COLORS.green },
      { key: "xact_p95_ms", name: "p95", color: COLORS.orange },
      { key: "xact_p99_ms", name: "p99", color: COLORS.red },
    ],
  },
  conns: {
    fmt: fmtInt,
    minTop: 4,
    integer: true,
    series: [
      { key: "cl_active", name: "clients active", color: COLORS.blue },
      { key: "cl_waiting", name: "clients waiting", color: COLORS.red },
      { key: "sv_active", name: "servers active", color: COLORS.purple },
      { key: "sv_idle", name: "servers idle", color: COLORS.grey },
    ],
  },
  wait: {
    fmt: fmtMs,
    // Waits are often microseconds: a 1 ms floor would flatten them on the axis.
    minTop: 0.01,
    series: [
      { key: "max_wait_ms", name: "longest wait now", color: COLORS.red },
      { key: "wait_avg_ms", name: "average wait", color: COLORS.orange },
    ],
  },
};

function drawChart(id) {
  const spec = charts[id];
  const canvas = document.getElementById("chart-" + id);
  const dpr = window.devicePixelRatio || 1;
  const w = canvas.clientWidth, h = canvas.clientHeight;
  if (canvas.width !== Math.round(w * dpr) || canvas.height !== Math.round(h * dpr)) {
    canvas.width = Math.round(w * dpr);
    canvas.height = Math.round(h * dpr);
  }
  const ctx = canvas.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, w, h);

  const end = samples.length ? samples[samples.length - 1].t : Date.now();
  const start = end - rangeSecs * 1000;
  const shown = samples.filter((s) => s.t >= start);
  let max = 0;
  for (const s of shown) for (const ser of spec.series) max = Math.max(max, s[ser.key] || 0);
  max = Math.max(max, spec.minTop);
  let step = niceStep(max, 4);
  if (spec.integer) step = Math.max(1, step);
  const top = Math.ceil(max / step) * step;

  const left = 52, right = 8, topPad = 8, bottom = 20;
  const pw = w - left - right, ph = h - topPad - bottom;
  const x = (t) => left + ((t - start) / (end - start)) * pw;
  const y = (v) => topPad + ph - (v / top) * ph;

  ctx.font = "11px system-ui, sans-serif";
  ctx.textBaseline = "middle";
  ctx.strokeStyle = "#eef0f3";
  ctx.fillStyle = "#6b7380";
  ctx.lineWidth = 1;
  for (let v = 0; v <= top + step / 2; v += step) {
    const yy = Math.round(y(v)) + 0.5;
    ctx.beginPath(); ctx.moveTo(left, yy); ctx.lineTo(left + pw, yy); ctx.stroke();
    ctx.textAlign = "right";
    ctx.fillText(spec.fmt(v), left - 6, yy);
  }
  // Time axis: a label every minute (or every 15 s on the 1-minute range).
  const every = rangeSecs <= 60 ? 15 : rangeSecs <= 300 ? 60 : 120;
  ctx.textAlign = "center";
  ctx.textBaseline = "top";
  for (let k = 0; k <= rangeSecs; k += every) {
    const t = end - k * 1000;
    const xx = x(t);
    ctx.textAlign = k === 0 ? "right" : k === rangeSecs ? "left" : "center";
    ctx.fillText(k === 0 ? "now" : `-${k >= 60 ? k / 60 + "m" : k + "s"}`, xx, topPad + ph + 5);
  }

  ctx.save();
  ctx.beginPath();
  ctx.rect(left, topPad - 1, pw, ph + 2);
  ctx.clip();
  for (const ser of spec.series) {
    ctx.strokeStyle = ser.color;
    ctx.lineWidth = 1.6;
    ctx.lineJoin = "round";
    ctx.beginPath();
    let prev = null;
    for (const s of shown) {
      const xx = x(s.t), yy = y(s[ser.key] || 0);
      // A gap of more than 3 s (page or process asleep) breaks the line.
      if (prev === null || s.t - prev > 3000) ctx.moveTo(xx, yy); else ctx.lineTo(xx, yy);
      prev = s.t;
    }
    ctx.stroke();
  }
  ctx.restore();

  // Hover: a vertical rule at the nearest sample; the legend shows its values.
  let at = shown.length ? shown[shown.length - 1] : null;
  if (hover && hover.chart === id && shown.length) {
    at = shown.reduce((a, b) => (Math.abs(b.t - hover.t) < Math.abs(a.t - hover.t) ? b : a));
    const xx = Math.round(x(at.t)) + 0.5;
    ctx.strokeStyle = "#9aa3b0";
    ctx.setLineDash([3, 3]);
    ctx.beginPath(); ctx.moveTo(xx, topPad); ctx.lineTo(xx, topPad + ph); ctx.stroke();
    ctx.setLineDash([]);
  }
  const legend = document.getElementById("legend-" + id);
  legend.replaceChildren();
  for (const ser of spec.series) {
    const item = document.createElement("span");
    const swatch = document.createElement("i");
    swatch.style.background = ser.color;
    const val = document.createElement("b");
    val.textContent = at ? spec.fmt(at[ser.key] || 0) : "–";
    item.append(swatch, ser.name + " ", val);
    legend.append(item);
  }
  if (at && hover && hover.chart === id) {
    const when = document.createElement("span");
    when.textContent = "at " + fmtClock(at.t);
    legend.append(when);
  }
}

function drawCharts() {
  for (const id of Object.keys(charts)) drawChart(id);
}

for (const id of Object.keys(charts)) {
  const canvas = document.getElementById("chart-" + id);
  canvas.addEventListener("mousemove", (ev) => {
    const r = canvas.getBoundingClientRect();
    const end = samples.length ? samples[samples.length - 1].t : Date.now();
    const left = 52, right = 8, pw = r.width - left - right;
    const frac = Math.min(1, Math.max(0, (ev.clientX - r.left - left) / pw));
    hover = { chart: id, t: end - rangeSecs * 1000 * (1 - frac) };
    drawChart(id);
  });
  canvas.addEventListener("mouseleave", () => { hover = null; drawChart(id); });
}

for (const b of document.querySelectorAll(".range button")) {
  b.addEventListener("click", () => {
    rangeSecs = Number(b.dataset.range);
    rangeChosen = true;
    for (const o of document.querySelectorAll(".range button")) o.classList.toggle("on", o === b);
    drawCharts();
  });
}
window.addEventListener("resize", drawCharts);

// ---- tables ----

function cell(text, cls) {
  const td = document.createElement("td");
  td.textContent = text;
  if (cls) td.className = cls;
  return td;
}

function fillTable(id, rows, emptyText, cols) {
  const body = document.querySelector(`#${id} tbody`);
  body.replaceChildren();
  if (!rows.length) {
    const tr = document.createElement("tr");
    const td = cell(emptyText, "empty");
    td.colSpan = cols;
    tr.append(td);
    body.append(tr);
    return;
  }
  for (const r of rows) body.append(r);
}

function renderPools(pools) {
  const rows = pools.map((p) => {
    const tr = document.createElement("tr");
    if (p.cl_waiting > 0 || p.login_error) tr.className = "warn";
    tr.append(
      cell(p.database), cell(p.user), cell(p.pool_mode),
      cell(fmtInt(p.cl_active), "n"), cell(fmtInt(p.cl_waiting), "n"),
      cell(fmtInt(p.sv_active), "n"), cell(fmtInt(p.sv_idle), "n"), cell(fmtInt(p.sv_login), "n"),
      cell(fmtInt(p.pool_size), "n"),
      cell(fmtMs(p.max_wait_ms), "n"), cell(fmtMs(p.wait_avg_ms), "n"),
      cell(fmtRate(p.tps), "n"), cell(fmtMs(p.xact_avg_ms), "n"), cell(fmtInt(p.xacts), "n"),
    );
    return tr;
  });
  fillTable("pools", rows, "No pools yet: they appear with their first client.", 14);
}

function renderHealth(dbs) {
  const rows = dbs.map((d) => {
    const tr = document.createElement("tr");
    const status = document.createElement("td");
    const dot = document.createElement("span");
    let label = "not checked yet";
    if (d.reachable === true) { dot.className = "dot ok"; label = "reachable"; }
    if (d.reachable === false) { dot.className = "dot bad"; label = "unreachable"; }
    if (d.paused) label += ", paused";
    if (d.disabled) label += ", disabled";
    status.append(dot, label);
    const problem = d.probe_error || d.login_error || "";
    if (d.reachable === false || d.login_error) tr.className = "warn";
    tr.append(
      cell(d.name), cell(d.address, "code"), status,
      cell(d.probe_ms == null ? "–" : fmtMs(d.probe_ms), "n"),
      cell(fmtInt(d.sv_active), "n"), cell(fmtInt(d.sv_idle), "n"), cell(fmtInt(d.sv_login), "n"),
      cell(problem, "msg"),
    );
    return tr;
  });
  fillTable("health", rows, "No databases configured.", 8);
}

function renderHosts(hosts) {
  const rows = hosts.map((h) => {
    const tr = document.createElement("tr");
    const state = document.createElement("td");
    const dot = document.createElement("span");
    if (h.state === "up") dot.className = "dot ok";
    if (h.state === "down") dot.className = "dot bad";
    state.append(dot, h.state + (h.in_rotation ? "" : ", out of rotation"));
    if (h.state === "down" || !h.in_rotation) tr.className = "warn";
    tr.append(
      cell(h.database), cell(h.host, "code"), cell(h.port == null ? "" : String(h.port), "n"),
      cell(h.role), state,
      cell(h.lag_s == null ? "–" : h.lag_s.toFixed(3) + " s", "n"),
      cell(fmtInt(h.active), "n"), cell(fmtInt(h.idle), "n"),
    );
    return tr;
  });
  fillTable("hosts", rows, "No databases configured.", 8);
}

function renderErrors(errors) {
  const rows = errors.recent.map((e) => {
    const tr = document.createElement("tr");
    const src = document.createElement("td");
    const tag = document.createElement("span");
    tag.className = "src " + e.source;
    tag.textContent = e.source === "server" ? "server" : "weir";
    src.append(tag);
    tr.append(
      cell(fmtClock(e.t)), src, cell(e.code, "code"),
      cell((e.severity ? e.severity + ": " : "") + e.message, "msg"), cell(e.database || ""),
    );
    return tr;
  });
  fillTable("errors", rows, "No errors.", 5);
  const classes = errors.by_class
    .map((c) => `${c.class}×${fmtInt(c.count)}`)
    .join("  ");
  document.getElementById("error-classes").textContent = classes ? "by class: " + classes : "";
}

// ---- polling ----

function render(d) {
  document.getElementById("version").textContent = "v" + d.version;
  document.getElementById("uptime").textContent = fmtDuration(d.uptime_s);
  document.getElementById("updated").textContent = fmtClock(d.now);
  const ready = document.getElementById("ready");
  ready.dataset.ready = d.ready ? "yes" : "no";
  ready.textContent = d.ready ? "ready" : "not ready";
  if (d.mode !== "running") ready.textContent += " · " + d.mode;
  const reasons = document.getElementById("reasons");
  reasons.hidden = d.ready;
  reasons.textContent = d.ready_reasons.join("\n");

  const c = d.current;
  // The tiles and the pools table average over the same few seconds; say how many.
  const win = `last ${Math.max(1, Math.round(c.window_s))} s`;
  for (const el of document.querySelectorAll("[data-window]")) el.textContent = win;
  document.getElementById("pools-window").textContent = `rates and averages: ${win}`;
  setFigure("kpi-tps", c.tps, fmtRate(c.tps));
  setFigure("kpi-qps", c.qps, fmtRate(c.qps));
  setFigure("kpi-xact-ms", c.xact_avg_ms, fmtMs(c.xact_avg_ms));
  setFigure("kpi-p99-ms", c.xact_p99_ms, fmtMs(c.xact_p99_ms));
  setFigure("kpi-cl-active", d.clients.active, fmtInt(d.clients.active));
  setFigure("kpi-cl-waiting", d.clients.waiting, fmtInt(d.clients.waiting));
  setFigure("kpi-sv-active", d.servers.active, fmtInt(d.servers.active));
  setFigure("kpi-sv-idle", d.servers.idle, fmtInt(d.servers.idle));
  setFigure("kpi-max-wait", c.max_wait_ms, fmtMs(c.max_wait_ms));
  setFigure("kpi-xacts-total", d.totals.xacts, fmtInt(d.totals.xacts));
  setFigure("kpi-conns", d.process.client_connections, fmtInt(d.process.client_connections));
  document.getElementById("kpi-conns-max").textContent = "of max_client_conn " + fmtInt(d.process.max_client_conn);
  setFigure("kpi-errors", d.totals.errors, fmtInt(d.totals.errors));
  document.getElementById("kpi-cl-waiting").classList.toggle("bad", d.clients.waiting > 0);

  for (const s of d.history) samples.push(s);
  if (samples.length > KEEP) samples = samples.slice(samples.length - KEEP);
  if (samples.length) lastT = samples[samples.length - 1].t;
  if (!rangeChosen && samples.length) {
    const span = (samples[samples.length - 1].t - samples[0].t) / 1000;
    rangeSecs = span <= 60 ? 60 : span <= 300 ? 300 : 600;
    for (const o of document.querySelectorAll(".range button")) {
      o.classList.toggle("on", Number(o.dataset.range) === rangeSecs);
    }
  }

  renderPools(d.pools);
  renderHealth(d.databases);
  renderHosts(d.hosts || []);
  renderErrors(d.errors);
  drawCharts();
}

async function poll() {
  try {
    const r = await fetch(`/api/stats?since=${lastT}`, { cache: "no-store" });
    if (!r.ok) throw new Error(`HTTP ${r.status}`);
    render(await r.json());
  } catch (e) {
    const ready = document.getElementById("ready");
    ready.dataset.ready = "no";
    ready.textContent = "no contact with Weir";
  }
  setTimeout(poll, POLL_MS);
}

poll();
