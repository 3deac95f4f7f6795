// Live metrics chart: the front end of raytpu_lab.widgets.run_chart.LiveChart.
//
// Plain DOM + SVG, no libraries, no network. Protocol ("full" / "append" / "thin" messages)
// is described in run_chart.py. Draws at most twice a second, in a fixed viewBox, so it draws
// whether or not the output is on screen. DOM contract used by the browser tests: root
// .raytpu-chart-live; one <g class="panel" data-key> per panel; one
// <path class="trace" data-rank data-key d="M..."> per rank and panel; metric <select>.

const NS = "http://www.w3.org/2000/svg";
const PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
  "#7f7f7f", "#bcbd22", "#17becf"];
const TITLES = { step_time_s: "step time (s)", steps_per_s: "throughput (steps/s)" };
const W = 960, PANEL_H = 220, GAP = 24, LEFT = 52, TOP = 30, BOTTOM = 34, LEGEND_MAX = 16;
const MIN_REDRAW_MS = 500;
const CSS = `
.raytpu-chart-live { font: 12px sans-serif; color: #202124; }
.raytpu-chart-live .bar { display: flex; align-items: center; gap: 12px; margin: 2px 0 4px; }
.raytpu-chart-live .bar label { display: inline-flex; align-items: center; gap: 6px; }
.raytpu-chart-live .bar select { font: inherit; min-width: 140px; }
.raytpu-chart-live .title { font-weight: bold; }
.raytpu-chart-live svg { display: block; width: 100%; max-width: ${W}px; height: auto; }
.raytpu-chart-live .legend { display: flex; flex-wrap: wrap; gap: 4px 14px; margin-top: 2px; }
.raytpu-chart-live .legend .sw { display: inline-block; width: 14px; height: 2px;
  vertical-align: middle; margin-right: 4px; }
`;

function svgEl(tag, attrs, parent) {
  const e = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (parent) parent.appendChild(e);
  return e;
}

// An HTML element with DOM properties set, appended to parent when given.
const htmlEl = (tag, props, parent) => {
  const e = Object.assign(document.createElement(tag), props);
  return parent ? parent.appendChild(e) : e;
};

function niceTicks(lo, hi, count = 4) {  // chart_svg.nice_ticks
  if (!(isFinite(lo) && isFinite(hi)) || hi <= lo) return isFinite(lo) ? [lo] : [];
  const raw = (hi - lo) / count, mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= raw);
  const out = [];
  for (let t = Math.ceil(lo / step) * step; t <= hi + step * 1e-9 && out.length < 20; t += step) out.push(+t.toPrecision(12));
  return out;
}

function fmt(v) {
  if (v === 0) return "0";
  const a = Math.abs(v);
  if (a >= 1e5 || a < 1e-3) return v.toExponential(1);
  return String(+v.toPrecision(4));
}

function render({ model, el }) {
  const root = htmlEl("div", { className: "raytpu-chart-live" });
  const style = htmlEl("style", { textContent: CSS });
  const bar = htmlEl("div", { className: "bar" });
  const title = htmlEl("span", { className: "title" }, bar);
  const label = htmlEl("label", {}, bar);
  const select = htmlEl("select", { className: "metric" });
  label.append("metric", select);
  const status = htmlEl("span", { className: "chart-status" }, bar);
  status.style.color = "#5f6368";
  const svg = svgEl("svg", { viewBox: `0 0 ${W} ${PANEL_H}`, preserveAspectRatio: "xMinYMin meet" });
  const legend = htmlEl("div", { className: "legend" });
  root.append(style, bar, svg, legend);
  el.appendChild(root);

  let gen = -1, panels = [], xlabel = "step", asked = false;
  let series = {};  // panel -> rank -> {x: [], y: [], tail: null}
  let timer = null, last = 0, dirty = false;

  function askFull() {
    if (asked) return;
    asked = true;
    model.send({ type: "request_full" });
  }

  function paintBar() {
    title.textContent = model.get("title") || "";
    const keys = model.get("metrics") || [];
    const key = model.get("key");
    const have = [...select.options].map((o) => o.value);
    if (have.join("\u0000") !== keys.join("\u0000")) {
      select.replaceChildren(...keys.map((k) => { const o = document.createElement("option"); o.value = k; o.textContent = k; return o; }));
    }
    select.value = key;
  }

  function trace(panel, rank) {
    const p = series[panel] || (series[panel] = {});
    return p[rank] || (p[rank] = { x: [], y: [], tail: null });
  }

  function add(msgSeries, msgTail) {
    for (const [panel, ranks] of Object.entries(msgSeries || {})) {
      for (const [rank, [xs, ys]] of Object.entries(ranks)) {
        const t = trace(panel, rank);
        for (let i = 0; i < xs.length; i++) { t.x.push(xs[i]); t.y.push(ys[i]); }
      }
    }
    for (const [panel, ranks] of Object.entries(msgTail || {})) {
      if (Array.isArray(ranks)) {  // [x, {rank: y}]: the ranks share x
        for (const [rank, y] of Object.entries(ranks[1])) trace(panel, rank).tail = [ranks[0], y];
      } else {
        for (const [rank, xy] of Object.entries(ranks)) trace(panel, rank).tail = xy;
      }
    }
  }

  function points(t) {
    const xs = t.x.slice(), ys = t.y.slice();
    if (t.tail && (!xs.length || t.tail[0] > xs[xs.length - 1])) { xs.push(t.tail[0]); ys.push(t.tail[1]); }
    return [xs, ys];
  }

  function drawPanel(panel, i, width) {
    const g = svgEl("g", { class: "panel", "data-key": panel, transform: `translate(${(i * (width + GAP)).toFixed(1)},0)` }, svg);
    const head = svgEl("text", { x: (width / 2).toFixed(1), y: TOP - 12, "text-anchor": "middle", "font-size": 13, "font-weight": "bold", fill: "#202124" }, g);
    head.textContent = TITLES[panel] || panel;
    const pw = width - LEFT - 8, ph = PANEL_H - TOP - BOTTOM;
    svgEl("rect", { x: LEFT, y: TOP, width: pw.toFixed(1), height: ph, fill: "#fafafa", stroke: "#dadce0" }, g);
    const ranks = Object.keys(series[panel] || {}).sort((a, b) => a - b);
    const data = ranks.map((r) => [r, points(series[panel][r])]);
    let x0 = Infinity, x1 = -Infinity, y0 = Infinity, y1 = -Infinity;
    for (const [, [xs, ys]] of data) {
      for (let k = 0; k < xs.length; k++) {
        if (!isFinite(ys[k])) continue;
        x0 = Math.min(x0, xs[k]); x1 = Math.max(x1, xs[k]); y0 = Math.min(y0, ys[k]); y1 = Math.max(y1, ys[k]);
      }
    }
    if (!isFinite(x0)) {
      const t = svgEl("text", { x: (LEFT + pw / 2).toFixed(1), y: TOP + ph / 2, "text-anchor": "middle", "font-size": 11, fill: "#5f6368" }, g);
      t.textContent = gen < 0 ? "loading…" : "waiting for reports…";
      return;
    }
    if (x1 === x0) { x0 -= 1; x1 += 1; }
    if (y1 === y0) { const pad = Math.abs(y0) * 0.1 || 1; y0 -= pad; y1 += pad; }
    const px = (v) => LEFT + ((v - x0) / (x1 - x0)) * pw;
    const py = (v) => TOP + ph - ((v - y0) / (y1 - y0)) * ph;
    for (const t of niceTicks(y0, y1)) {
      svgEl("line", { x1: LEFT, x2: (LEFT + pw).toFixed(1), y1: py(t).toFixed(1), y2: py(t).toFixed(1), stroke: "#e8eaed" }, g);
      svgEl("text", { x: LEFT - 4, y: (py(t) + 3).toFixed(1), "text-anchor": "end", "font-size": 10, fill: "#5f6368" }, g).textContent = fmt(t);
    }
    for (const t of niceTicks(x0, x1)) {
      svgEl("text", { x: px(t).toFixed(1), y: TOP + ph + 13, "text-anchor": "middle", "font-size": 10, fill: "#5f6368" }, g).textContent = fmt(t);
    }
    svgEl("text", { x: (LEFT + pw / 2).toFixed(1), y: PANEL_H - 4, "text-anchor": "middle", "font-size": 10, fill: "#5f6368" }, g).textContent = xlabel;
    for (const [rank, [xs, ys]] of data) {
      let d = "";
      let n = 0, lx = 0, ly = 0;
      for (let k = 0; k < xs.length; k++) {
        if (!isFinite(ys[k])) continue;
        lx = px(xs[k]); ly = py(ys[k]);
        d += `${n ? " L" : "M"}${lx.toFixed(1)},${ly.toFixed(1)}`;
        n++;
      }
      if (!n) continue;
      const color = PALETTE[rank % PALETTE.length];
      svgEl("path", { class: "trace", "data-rank": rank, "data-key": panel, d, fill: "none", stroke: color, "stroke-width": 1.5 }, g);
      if (n === 1) svgEl("circle", { cx: lx.toFixed(1), cy: ly.toFixed(1), r: 2.5, fill: color }, g);
    }
  }

  function draw() {
    timer = null; dirty = false; last = Date.now();
    svg.replaceChildren();
    const shown = panels.length ? panels : [model.get("key"), "step_time_s", "steps_per_s"];
    const width = (W - GAP * (shown.length - 1)) / shown.length;
    shown.forEach((p, i) => drawPanel(p, i, width));
    const ranks = [...new Set(Object.values(series).flatMap((p) => Object.keys(p)))].sort((a, b) => a - b);
    legend.replaceChildren(...ranks.slice(0, LEGEND_MAX).map((r) => {
      const s = document.createElement("span");
      s.innerHTML = `<span class="sw" style="background:${PALETTE[r % PALETTE.length]}"></span>`;
      s.append(`rank ${r}`);
      return s;
    }));
    if (ranks.length > LEGEND_MAX) legend.append(`+${ranks.length - LEGEND_MAX} more ranks`);
  }

  function schedule() {  // at most one draw per MIN_REDRAW_MS, the last state always drawn
    dirty = true;
    if (timer !== null) return;
    timer = setTimeout(draw, Math.max(0, last + MIN_REDRAW_MS - Date.now()));
  }

  function onMsg(msg) {
    if (!msg || typeof msg !== "object") return;
    if (msg.type === "full") {
      asked = false;
      gen = msg.gen; panels = msg.panels || []; xlabel = msg.xlabel || "step";
      series = {};
      add(msg.series, msg.tail);
      schedule();
    } else if (msg.type === "thin") {
      if (msg.from_gen !== gen) { askFull(); return; }
      const k = msg.factor;
      for (const p of Object.values(series)) {
        for (const t of Object.values(p)) { t.x = t.x.filter((_, i) => i % k === 0); t.y = t.y.filter((_, i) => i % k === 0); }
      }
      gen = msg.gen;
      schedule();
    } else if (msg.type === "append") {
      if (msg.gen !== gen) { askFull(); return; }
      add(msg.series, msg.tail);
      schedule();
    }
  }

  function onSelect() {
    if (select.value && select.value !== model.get("key")) {
      model.set("key", select.value);
      model.save_changes();
    }
  }
  const onTraits = () => { paintBar(); schedule(); };
  const listeners = [["msg:custom", onMsg], ["change:metrics", onTraits],
                     ["change:key", onTraits], ["change:title", onTraits]];
  for (const [event, handler] of listeners) model.on(event, handler);
  select.addEventListener("change", onSelect);
  paintBar();
  draw();
  askFull();

  return () => {
    if (timer !== null) clearTimeout(timer);
    for (const [event, handler] of listeners) model.off(event, handler);
    root.remove();
  };
}

export default { render };
