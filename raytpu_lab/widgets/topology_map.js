// Live TPU topology map, the front end of raytpu_lab.widgets.topology_map.TopologyMap. Plain DOM + SVG.
// Protocol (geometry/selected traits, full/delta/details messages, row columns SLICE_ROW, HOST_ROW,
// NODE_ROW): declared once in raytpu_lab/_protocols.py; tests/unit/test_map_protocol.py checks the
// names read here. No libraries, no network. DOM contract used by the browser tests:
// root .raytpu-map; .slice[data-slice] (class "highlight" when highlighted); .host[data-slice]
// [data-worker][data-state]; .chip[data-state][data-holder] (chips in Ray chip id order; holder
// when known); status text in .raytpu-map-status;
// .dcn-link[data-from][data-to] between consecutive slices of a multi-slice group (trait dcn).

const NS = "http://www.w3.org/2000/svg";
const CHIP = 14, CHIP_GAP = 3, HOST_PAD = 4, HOST_LABEL = 11, HOST_GAP = 8;
const CELL = 10, CELL_GAP = 2, PAD = 10, TITLE_H = 18, LINE_H = 14, PLANE_GAP = 16;
const PANEL_GAP = 12, MAX_W = 980, TILE_W = 176, TILE_H = 66, VIEW_MAX_H = 640;
const HIGHLIGHT = "#a142f4", HELD = "#202124";
const CSS = `
.raytpu-map { font: 12px sans-serif; color: #202124; position: relative; }
.raytpu-map-bar { display: flex; flex-wrap: wrap; gap: 12px; align-items: center; margin: 4px 0; }
.raytpu-map-bar .swatch { display: inline-block; width: 10px; height: 10px; border-radius: 2px;
  margin-right: 4px; vertical-align: -1px; }
.raytpu-map-bar button { font: inherit; padding: 0 6px; }
.raytpu-map-stage { position: relative; overflow: hidden; border: 1px solid #dadce0;
  border-radius: 6px; background: #fff; outline: none; cursor: grab; }
.raytpu-map-stage:focus { border-color: #a142f4; }
.raytpu-map-stage.panning { cursor: grabbing; }
.raytpu-map svg { display: block; user-select: none; }
.raytpu-map .host, .raytpu-map .slice-title, .raytpu-map .summary { cursor: pointer; }
.raytpu-map .host.selected > rect:first-child { stroke: #202124; stroke-width: 3; }
.raytpu-map .slice.selected > .frame { stroke: #202124; stroke-width: 2; }
.raytpu-map .ici { pointer-events: none; }
.raytpu-map-tooltip { position: absolute; pointer-events: none; z-index: 10; display: none;
  background: rgba(32,33,36,.94); color: #fff; padding: 6px 8px; border-radius: 4px;
  font: 11px/1.4 monospace; white-space: pre; max-width: 520px; overflow: hidden; }
.raytpu-map-status { margin-top: 4px; color: #5f6368; }
`;

function svgEl(tag, attrs, parent) {
  const e = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (parent) parent.appendChild(e);
  return e;
}

function htmlEl(tag, props, parent) {  // as svgEl, for HTML elements (props are DOM properties)
  const e = Object.assign(document.createElement(tag), props || {});
  if (parent) parent.appendChild(e);
  return e;
}

function hostPos(g, w) {  // worker id -> host grid coordinate, x fastest (SliceShape.host_coords)
  const gx = g.grid[0], gy = g.grid[1];
  return [w % gx, Math.floor(w / gx) % gy, Math.floor(w / (gx * gy))];
}

const CHIP_LETTERS = { r: "reserved", b: "busy", f: "free" };  // HostState.chip_layout

function chipStates(states, row, perHost) {  // HostState.chip_states
  const [code, free, reserved, busy, owner, layout] = row;
  const st = states[code];
  if (st === "dead" || st === "missing" || st === "provisioning") return Array(perHost).fill(st);
  const out = layout ? [...layout].map((c) => CHIP_LETTERS[c] || "missing")
    : [...Array(reserved).fill("reserved"), ...Array(busy).fill("busy"), ...Array(free).fill("free")];
  while (out.length < perHost) out.push("missing");
  return out.slice(0, perHost);
}

function panelSize(g, withChips) {
  const [bx, by] = g.block;
  const hostW = withChips ? 2 * HOST_PAD + bx * CHIP + (bx - 1) * CHIP_GAP : CELL;
  const hostH = withChips ? 2 * HOST_PAD + HOST_LABEL + by * CHIP + (by - 1) * CHIP_GAP : CELL;
  const gap = withChips ? HOST_GAP : CELL_GAP;
  const planes = g.grid.length === 3 ? g.grid[2] : 1;
  const planeW = g.grid[0] * hostW + (g.grid[0] - 1) * gap;
  const planeLabel = planes > 1 ? LINE_H : 0;
  const planeH = planeLabel + g.grid[1] * hostH + (g.grid[1] - 1) * gap;
  const perRow = Math.max(1, Math.min(planes, Math.floor((MAX_W - 2 * PAD + PLANE_GAP) / (planeW + PLANE_GAP))));
  return { hostW, hostH, gap, planes, planeW, planeH, planeLabel, perRow };
}

function render({ model, el }) {
  const root = htmlEl("div", { className: "raytpu-map" });
  const style = htmlEl("style", { textContent: CSS });
  const bar = htmlEl("div", { className: "raytpu-map-bar" });
  const legend = htmlEl("span", {}, bar);
  const iciLabel = htmlEl("label", {}, bar);
  const ici = htmlEl("input", { type: "checkbox", className: "raytpu-map-ici" });
  iciLabel.append(ici, " ICI links");
  const reset = htmlEl("button", { textContent: "reset view",
    title: "Zoom: ctrl/⌘ + wheel, or wheel after clicking the map. Pan: drag." }, bar);
  const stage = htmlEl("div", { className: "raytpu-map-stage", tabIndex: 0 });
  const svg = svgEl("svg", { width: "100%", height: "40" }, stage);
  const viewport = svgEl("g", { class: "viewport" }, svg);
  const tip = htmlEl("div", { className: "raytpu-map-tooltip" });
  const status = htmlEl("div", { className: "raytpu-map-status" });
  root.append(style, bar, stage, tip, status);
  el.appendChild(root);

  let geometry = model.get("geometry") || {};
  let data = null;        // the last full state, with deltas applied
  let pendingFull = null; // a full state for a geometry not received yet
  let asked = false;      // a request_full is outstanding
  let hostEls = [];       // [slice][worker] -> <g class="host">
  let sliceEls = [];      // [slice] -> <g class="slice">
  let boxes = [];         // [slice] -> [x, y, w, h] of its panel in viewport units
  const expanded = new Set();
  const details = new Map();  // "slice/worker" -> details message
  let tipFor = null;      // [sliceIndex, worker] under the pointer
  let view = { k: 1, x: 0, y: 0 };

  const colors = () => geometry.colors || {};
  const states = () => geometry.states || [];
  const slices = () => geometry.slices || [];
  const totalHosts = () => slices().reduce((n, g) => n + g.hosts, 0);
  const summaryMode = () => totalHosts() > (geometry.summary_hosts || 256);
  const sliceColor = (st) => ({ partial: "#81c995", degraded: colors().dead })[st] || colors()[st] || "#9aa0a6";

  function askFull() {
    if (asked) return;
    asked = true;
    model.send({ type: "request_full" });
  }

  function drawLegend() {
    legend.replaceChildren();
    for (const [st, c] of Object.entries(colors())) {
      const item = document.createElement("span");
      item.className = "legend";
      item.dataset.state = st;
      item.style.marginRight = "10px";
      item.innerHTML = `<span class="swatch" style="background:${c}"></span>`;
      item.append(st);
      legend.appendChild(item);
    }
    const hl = document.createElement("span");
    hl.innerHTML = `<span class="swatch" style="background:none;outline:2px solid ${HIGHLIGHT}"></span>`;
    hl.append("highlighted");
    legend.appendChild(hl);
    const held = document.createElement("span");
    held.style.marginLeft = "10px";
    held.innerHTML = `<span class="swatch" style="background:none;outline:2px solid ${HELD}"></span>`;
    held.append("in use by a process (hover a host: who)");
    legend.appendChild(held);
  }

  // --- drawing -----------------------------------------------------------------------------------

  function paintHost(si, w) {
    const e = hostEls[si] && hostEls[si][w];
    if (!e || !data) return;
    const row = data.hosts[si][w];
    const st = states()[row[0]] || "missing";
    e.setAttribute("data-state", st);
    const frame = e.firstChild;
    const dash = st === "dead" || st === "missing" || st === "provisioning" ? "3 2" : "none";
    frame.setAttribute("stroke-dasharray", dash);
    if (e.classList.contains("cell")) { frame.setAttribute("fill", colors()[st]); return; }
    frame.setAttribute("stroke", colors()[st]);
    const chips = e.querySelectorAll(".chip");
    const cs = chipStates(states(), row, chips.length);
    const holders = row[6] || [];
    chips.forEach((c, i) => {
      c.setAttribute("data-state", cs[i]);
      c.setAttribute("fill", colors()[cs[i]]);
      // A chip a process holds (Ray named it) is outlined; hovering the host names the process.
      if (holders[i]) { c.setAttribute("data-holder", holders[i]); c.setAttribute("stroke", HELD); c.setAttribute("stroke-width", 2); }
      else { c.removeAttribute("data-holder"); c.removeAttribute("stroke"); }
    });
  }

  function paintSlice(si) {
    const e = sliceEls[si];
    if (!e || !data) return;
    const [title, state, reasons] = data.slices[si];
    e.setAttribute("data-state", state);
    const fit = (node, text) => {
      if (!node) return;
      const n = +node.getAttribute("data-chars") || 80;
      node.textContent = text.length > n ? text.slice(0, n - 1) + "…" : text;
    };
    const name = slices()[si].name;
    fit(e.querySelector(":scope > .info"), title.startsWith(name + " · ") ? title.slice(name.length + 3) : title);
    fit(e.querySelector(":scope > .reasons"), reasons);
    const tt = e.querySelector(":scope > .slice-title > title");
    if (tt) tt.textContent = reasons ? `${title}\n${reasons}` : title;
    if (e.classList.contains("summary")) paintTile(si, e);
  }

  function paintTile(si, e) {
    const g = slices()[si];
    const counts = {};
    for (const row of data.hosts[si]) { const st = states()[row[0]]; counts[st] = (counts[st] || 0) + 1; }
    e.querySelector(".frame").setAttribute("stroke", sliceColor(data.slices[si][1]));
    const barG = e.querySelector(".bar");
    barG.replaceChildren();
    let x = PAD;
    const w = TILE_W - 2 * PAD;
    for (const st of states()) {
      if (!counts[st]) continue;
      const dx = (w * counts[st]) / g.hosts;
      svgEl("rect", { x, y: 40, width: dx, height: 10, fill: colors()[st] }, barG);
      x += dx;
    }
    e.querySelector(".counts").textContent = states().filter((s) => counts[s]).map((s) => `${counts[s]} ${s}`).join(" · ");
  }

  function drawTile(si, g, parent) {
    const e = svgEl("g", { class: "slice summary", "data-slice": g.name }, parent);
    svgEl("rect", { class: "frame", x: 0, y: 0, width: TILE_W, height: TILE_H, rx: 6, fill: "#fff", "stroke-width": 3 }, e);
    const t = svgEl("text", { class: "slice-name", x: PAD, y: 18, "font-weight": "bold" }, e);
    t.textContent = g.name.length > 26 ? g.name.slice(0, 25) + "…" : g.name;
    svgEl("text", { x: PAD, y: 33, "font-size": 11, fill: "#5f6368" }, e).textContent = `${g.pod_type} · ${g.topology} · ${g.hosts} hosts`;
    svgEl("g", { class: "bar" }, e);
    svgEl("text", { class: "counts", x: PAD, y: 62, "font-size": 9, fill: "#5f6368" }, e);
    const tt = svgEl("title", {}, e);
    tt.textContent = "click to expand";
    hostEls[si] = [];
    return [TILE_W, TILE_H, e];
  }

  function drawPanel(si, g, parent) {
    const withChips = g.hosts <= (geometry.chips_hosts || 64);
    const L = panelSize(g, withChips);
    const rows = Math.ceil(L.planes / L.perRow);
    const top = PAD + TITLE_H + 2 * LINE_H;
    const width = 2 * PAD + Math.max(L.perRow * L.planeW + (L.perRow - 1) * PLANE_GAP, 7.6 * g.name.length + 60, 280);
    const height = top + rows * L.planeH + (rows - 1) * PLANE_GAP + PAD;
    const e = svgEl("g", { class: "slice", "data-slice": g.name }, parent);
    svgEl("rect", { class: "frame", x: 0, y: 0, width, height, rx: 6, fill: "#fff", stroke: "#dadce0" }, e);
    const title = svgEl("text", { class: "slice-title", "data-slice": g.name, x: PAD, y: PAD + 11, "font-weight": "bold" }, e);
    title.textContent = g.name;
    svgEl("text", { class: "info", "data-chars": Math.floor((width - 2 * PAD) / 5.6), x: PAD, y: PAD + TITLE_H + 7, "font-size": 10, fill: "#3c4043" }, e);
    svgEl("text", { class: "reasons", "data-chars": Math.floor((width - 2 * PAD) / 5.6), x: PAD, y: PAD + TITLE_H + LINE_H + 7, "font-size": 10, fill: colors().dead }, e);
    svgEl("title", {}, title);
    if (summaryMode()) {
      const c = svgEl("text", { class: "collapse", "data-slice": g.name, x: width - PAD, y: PAD + 11, "text-anchor": "end", fill: "#1a73e8", cursor: "pointer" }, e);
      c.textContent = "collapse";
    }
    const centres = new Map();
    hostEls[si] = [];
    const [bx, by] = g.block;
    for (let w = 0; w < g.hosts; w++) {
      const [hx, hy, hz] = hostPos(g, w);
      const ox = PAD + (hz % L.perRow) * (L.planeW + PLANE_GAP);
      const oy = top + Math.floor(hz / L.perRow) * (L.planeH + PLANE_GAP);
      if (hx === 0 && hy === 0 && L.planeLabel) svgEl("text", { x: ox, y: oy + 10, "font-size": 10, fill: "#5f6368" }, e).textContent = `z=${hz}`;
      const x = ox + hx * (L.hostW + L.gap), y = oy + L.planeLabel + hy * (L.hostH + L.gap);
      const h = svgEl("g", { class: withChips ? "host" : "host cell", "data-slice": g.name, "data-worker": w, "data-state": "missing" }, e);
      hostEls[si][w] = h;
      if (!withChips) { svgEl("rect", { x, y, width: L.hostW, height: L.hostH, stroke: "#5f6368", "stroke-width": 0.5 }, h); continue; }
      svgEl("rect", { x, y, width: L.hostW, height: L.hostH, rx: 3, fill: "#f8f9fa", "stroke-width": 1.5 }, h);
      svgEl("text", { x: x + L.hostW / 2, y: y + L.hostH - 4, "text-anchor": "middle", "font-size": 9, fill: "#3c4043" }, h).textContent = `w${w}`;
      for (let i = 0; i < bx * by; i++) {
        const cx = i % bx, cy = Math.floor(i / bx);
        const px = x + HOST_PAD + cx * (CHIP + CHIP_GAP), py = y + HOST_PAD + cy * (CHIP + CHIP_GAP);
        svgEl("rect", { class: "chip", x: px, y: py, width: CHIP, height: CHIP, rx: 2 }, h);
        centres.set(`${hx * bx + cx},${hy * by + cy},${hz}`, [px + CHIP / 2, py + CHIP / 2]);
      }
    }
    if (withChips && ici.checked && g.known !== false) drawLinks(g, centres, e);  // no links on a schematic grid
    return [width, height, e];
  }

  function drawLinks(g, centres, parent) {
    const lg = svgEl("g", { class: "ici", stroke: "#5f6368", "stroke-width": 1, fill: "none", opacity: 0.7 });
    const dims = [...g.dims, 1, 1].slice(0, 3);
    const wrap = [...g.wrap, false, false].slice(0, 3);
    let n = 0;
    for (const [key, a] of centres) {
      const c = key.split(",").map(Number);
      for (let axis = 0; axis < g.ndims; axis++) {
        let nxt = c[axis] + 1, wrapped = false;
        if (nxt === dims[axis]) { if (!wrap[axis] || dims[axis] <= 2) continue; nxt = 0; wrapped = true; }
        const o = [...c]; o[axis] = nxt;
        const b = centres.get(o.join(","));
        if (!b) continue;
        n++;
        if (!wrapped && axis < 2) { svgEl("line", { class: "link", x1: a[0], y1: a[1], x2: b[0], y2: b[1] }, lg); continue; }
        // z links and torus wrap-around: a dashed arc, bulging away from the straight path
        const mx = (a[0] + b[0]) / 2, my = (a[1] + b[1]) / 2 - (axis === 0 || axis === 2 ? 18 : 0);
        const qx = axis === 1 ? Math.min(a[0], b[0]) - 18 : mx;
        svgEl("path", { class: axis === 2 ? "link z" : "link wrap", d: `M${a[0]},${a[1]} Q${qx},${my} ${b[0]},${b[1]}`, "stroke-dasharray": "2 2", stroke: axis === 2 ? "#1a73e8" : "#5f6368", opacity: axis === 2 ? 0.35 : 0.8 }, lg);
      }
    }
    lg.setAttribute("data-links", n);
    parent.appendChild(lg);
  }

  function draw() {
    viewport.replaceChildren();
    hostEls = []; sliceEls = []; boxes = [];
    drawLegend();
    let x = PAD, y = PAD, rowH = 0, width = 0;
    const summary = summaryMode(), maxW = wrapWidth();
    slices().forEach((g, si) => {
      const wrapG = svgEl("g", {}, viewport);
      const [w, h, e] = summary && !expanded.has(g.name) ? drawTile(si, g, wrapG) : drawPanel(si, g, wrapG);
      sliceEls[si] = e;
      if (x > PAD && x + w > maxW) { x = PAD; y += rowH + PANEL_GAP; rowH = 0; }
      wrapG.setAttribute("transform", `translate(${x},${y})`);
      boxes[si] = [x, y, w, h];
      x += w + PANEL_GAP; rowH = Math.max(rowH, h); width = Math.max(width, x);
    });
    if (!slices().length) {
      svgEl("text", { x: PAD, y: PAD + 12, fill: "#5f6368" }, viewport).textContent = "No TPU slices in this cluster.";
      rowH = 20; width = 300;
    }
    const height = y + rowH + PAD;
    svg.setAttribute("height", Math.min(height, VIEW_MAX_H));
    svg.setAttribute("viewBox", `0 0 ${Math.max(width, 300)} ${Math.min(height, VIEW_MAX_H)}`);
    svg.style.maxWidth = `${Math.max(width, 300)}px`;
    // Height from the viewBox's aspect ratio: a fixed height in a narrow panel (the sidebar)
    // left the scaled-down drawing floating in a tall empty box, and hit-testing off.
    svg.style.height = "auto";
    drawnFor = stage.clientWidth;
    if (data) { slices().forEach((g, si) => { paintSlice(si); (hostEls[si] || []).forEach((_, w) => paintHost(si, w)); }); }
    paintHighlight(); paintDcn(); paintSelected(); paintStatus(); applyView();
  }

  // Slices wrap at the width the map is shown at (a 240 px sidebar stacks them) rather than
  // shrinking to fit; MAX_W when not laid out yet (a hidden tab).
  function wrapWidth() {
    const w = stage.clientWidth;
    return w > 0 ? Math.max(300, Math.min(MAX_W, w)) : MAX_W;
  }
  let drawnFor = 0;
  const resized = typeof ResizeObserver === "undefined" ? null : new ResizeObserver(() => {
    const w = stage.clientWidth;
    if (w > 0 && Math.abs(w - drawnFor) >= 24 && (w < MAX_W || drawnFor < MAX_W)) draw();
  });

  function paintDcn() {  // multi-slice: a dashed link badged "DCN" between consecutive slices
    viewport.querySelectorAll(":scope > .dcn").forEach((e) => e.remove());
    const layer = svgEl("g", { class: "dcn" }, viewport);
    for (const group of model.get("dcn") || []) {
      const idx = group.map((name) => slices().findIndex((g) => g.name === name)).filter((i) => i >= 0 && boxes[i]);
      for (let k = 0; k + 1 < idx.length; k++) {
        const [ax, ay, aw, ah] = boxes[idx[k]], [bx, by, bw, bh] = boxes[idx[k + 1]];
        const same = Math.abs(ay - by) < 1;
        const [x1, y1, x2, y2] = same ? [ax + aw, ay + ah / 2, bx, by + bh / 2] : [ax + aw / 2, ay + ah, bx + bw / 2, by];
        const mx = (x1 + x2) / 2, my = (y1 + y2) / 2;
        const link = svgEl("g", { class: "dcn-link", "data-from": group[k], "data-to": group[k + 1] }, layer);
        svgEl("line", { x1, y1, x2, y2, stroke: HIGHLIGHT, "stroke-width": 2, "stroke-dasharray": "4 3" }, link);
        svgEl("rect", { x: mx - 16, y: my - 8, width: 32, height: 16, rx: 8, fill: HIGHLIGHT }, link);
        svgEl("text", { x: mx, y: my + 4, "text-anchor": "middle", "font-size": 10, "font-weight": "bold", fill: "#fff" }, link).textContent = "DCN";
        svgEl("title", {}, link).textContent = `${slices()[idx[k]].name} and ${slices()[idx[k + 1]].name}: one multi-slice run, joined by DCN (not ICI)`;
      }
    }
  }

  function paintHighlight() {
    const hl = new Set(model.get("highlight") || []);
    sliceEls.forEach((e, si) => {
      const on = hl.has(slices()[si].name);
      e.classList.toggle("highlight", on);
      let ring = e.querySelector(":scope > .ring");
      if (on && !ring) {
        const f = e.querySelector(".frame");
        ring = svgEl("rect", { class: "ring", x: -3, y: -3, width: +f.getAttribute("width") + 6, height: +f.getAttribute("height") + 6, rx: 8, fill: "none", stroke: HIGHLIGHT, "stroke-width": 3 });
        e.insertBefore(ring, e.firstChild);
      } else if (!on && ring) ring.remove();
    });
  }

  function paintSelected() {
    const sel = model.get("selected") || {};
    root.querySelectorAll(".selected").forEach((e) => e.classList.remove("selected"));
    const si = slices().findIndex((g) => g.name === sel.slice);
    if (si < 0) return;
    if (sel.worker === undefined || sel.worker === null) { sliceEls[si] && sliceEls[si].classList.add("selected"); return; }
    const h = hostEls[si] && hostEls[si][sel.worker];
    if (h) h.classList.add("selected");
  }

  function paintStatus() {
    const parts = [];
    const text = model.get("status");
    if (text) parts.push(text);
    if (!data) parts.push("waiting for cluster state…");
    else {
      let free = 0, total = 0;
      data.hosts.forEach((rows) => rows.forEach((r) => {
        const st = states()[r[0]];
        if (st !== "dead" && st !== "missing" && st !== "provisioning") { free += r[1]; total += r[1] + r[2] + r[3]; }
      }));
      parts.push(`${slices().length} slices · ${totalHosts()} hosts · chips free ${free}/${total}`);
      if (data.other) parts.push(`${data.other} other node${data.other === 1 ? "" : "s"}`);
      if (data.pending && data.pending.length) parts.push(`waiting for placement: ${data.pending.join(", ")}`);
      if (summaryMode()) parts.push("click a slice to expand it");
      if (+svg.getAttribute("height") >= VIEW_MAX_H) parts.push("drag to pan, ctrl/⌘+wheel to zoom");
      parts.push(`rev ${data.rev} at ${new Date().toLocaleTimeString()}`);
    }
    status.textContent = parts.join(" · ");
  }

  // --- messages ----------------------------------------------------------------------------------

  function applyFull(msg) {
    data = { rev: msg.rev, slices: msg.slices, hosts: msg.hosts, nodes: msg.nodes, other: msg.other, pending: msg.pending };
    details.clear();
    draw();
  }

  function applyDelta(msg) {
    for (const [si, title, state, reasons] of msg.s) { data.slices[si] = [title, state, reasons]; }
    for (const [si, w, ...row] of msg.h) { data.hosts[si][w] = row; paintHost(si, w); }
    for (const [si, w, ...node] of msg.n) { data.nodes[si][w] = node; }
    for (const [si, w] of [...msg.h, ...msg.n]) details.delete(`${slices()[si].name}/${w}`);
    for (const [si] of msg.s) paintSlice(si);
    if (summaryMode()) new Set(msg.h.map((r) => r[0])).forEach((si) => paintSlice(si));
    data.rev = msg.rev; data.other = msg.other; data.pending = msg.pending;
    paintStatus();
    if (tipFor) showTip(...tipFor);
  }

  function onMsg(msg) {
    if (!msg || typeof msg !== "object") return;
    if (msg.type === "full") {
      asked = false;
      if (msg.geometry_rev === geometry.rev) applyFull(msg);
      else if (msg.geometry_rev > (geometry.rev || 0)) pendingFull = msg;
    } else if (msg.type === "delta") {
      if (!data || msg.geometry_rev !== geometry.rev || msg.base !== data.rev) askFull();
      else applyDelta(msg);
    } else if (msg.type === "details") {
      details.set(`${msg.slice}/${msg.worker}`, msg);
      if (tipFor && slices()[tipFor[0]] && slices()[tipFor[0]].name === msg.slice && tipFor[1] === msg.worker) showTip(...tipFor);
    }
  }

  function onGeometry() {
    geometry = model.get("geometry") || {};
    data = null;
    for (const name of [...expanded]) if (!slices().some((g) => g.name === name)) expanded.delete(name);
    if (pendingFull && pendingFull.geometry_rev === geometry.rev) { const m = pendingFull; pendingFull = null; applyFull(m); }
    else draw();
  }

  // --- tooltip, selection, zoom/pan --------------------------------------------------------------

  function hostAt(target) {
    const h = target.closest && target.closest(".host");
    if (!h) return null;
    const si = slices().findIndex((g) => g.name === h.getAttribute("data-slice"));
    return si < 0 ? null : [si, +h.getAttribute("data-worker")];
  }

  function showTip(si, w) {
    if (!data || !data.hosts[si]) return;
    const g = slices()[si];
    const [code, free, reserved, busy, owner, layout, holders] = data.hosts[si][w];
    const [node_id, ip] = data.nodes[si][w];
    const d = details.get(`${g.name}/${w}`);
    const lines = [`${g.name} worker ${w}${w === 0 ? " (head)" : ""}`, `state ${states()[code]}`,
      `node ${node_id || "-"}`, `IP ${ip || "-"}`,
      `chips ${free} free · ${reserved} reserved · ${busy} busy`, `owner ${owner || "-"}`];
    const byHolder = new Map();  // holder -> its Ray chip ids
    (holders || []).forEach((who, i) => { if (who) byHolder.set(who, [...(byHolder.get(who) || []), i]); });
    for (const [who, ids] of byHolder) lines.push(`chip${ids.length > 1 ? "s" : ""} ${ids.join(",")}: ${who}`);
    if (d && d.labels) lines.push("labels:", ...Object.entries(d.labels).map(([k, v]) => `  ${k}=${v}`));
    else if (node_id) lines.push("labels: …");
    tip.textContent = lines.join("\n");
    tip.style.display = "block";
  }

  function onMove(ev) {
    const hit = hostAt(ev.target);
    if (!hit) { tip.style.display = "none"; tipFor = null; return; }
    const key = `${slices()[hit[0]].name}/${hit[1]}`;
    if (!tipFor || tipFor[0] !== hit[0] || tipFor[1] !== hit[1]) {
      tipFor = hit;
      if (!details.has(key) && data && data.nodes[hit[0]][hit[1]][0]) model.send({ type: "details", slice: slices()[hit[0]].name, worker: hit[1] });
      showTip(...hit);
    }
    const r = root.getBoundingClientRect();
    tip.style.left = `${ev.clientX - r.left + 14}px`;
    tip.style.top = `${ev.clientY - r.top + 14}px`;
  }

  function onLeave() { tip.style.display = "none"; tipFor = null; }

  function select(value) {
    model.set("selected", value);
    model.save_changes();
    paintSelected();
  }

  let drag = null, dragged = false;
  function onClick(ev) {
    if (dragged) { dragged = false; return; }
    const t = ev.target;
    const collapse = t.closest && t.closest(".collapse");
    if (collapse) { expanded.delete(collapse.getAttribute("data-slice")); draw(); return; }
    const tile = t.closest && t.closest(".slice.summary");
    if (tile) { const name = tile.getAttribute("data-slice"); expanded.add(name); select({ slice: name }); draw(); return; }
    const title = t.closest && t.closest(".slice-title");
    if (title) { select({ slice: title.getAttribute("data-slice") }); return; }
    const hit = hostAt(t);
    if (hit) {
      const node = data && data.nodes[hit[0]] ? data.nodes[hit[0]][hit[1]][0] : null;
      select({ slice: slices()[hit[0]].name, worker: hit[1], node_id: node });
      return;
    }
    select({});
  }

  function applyView() { viewport.setAttribute("transform", `translate(${view.x},${view.y}) scale(${view.k})`); }
  function onWheel(ev) {
    if (!(ev.ctrlKey || ev.metaKey || document.activeElement === stage)) return;
    ev.preventDefault();
    const r = svg.getBoundingClientRect();
    const vb = svg.viewBox.baseVal, sx = vb && vb.width ? vb.width / r.width : 1;
    const px = (ev.clientX - r.left) * sx, py = (ev.clientY - r.top) * sx;
    const k = Math.min(20, Math.max(0.2, view.k * Math.exp(-ev.deltaY * 0.0015)));
    view = { k, x: px - ((px - view.x) * k) / view.k, y: py - ((py - view.y) * k) / view.k };
    applyView();
  }
  function onDown(ev) { if (ev.button === 0) drag = { x: ev.clientX, y: ev.clientY, vx: view.x, vy: view.y, moved: false }; }
  function onDragMove(ev) {
    if (!drag) return;
    const dx = ev.clientX - drag.x, dy = ev.clientY - drag.y;
    if (!drag.moved && Math.hypot(dx, dy) < 4) return;
    drag.moved = true;
    stage.classList.add("panning");
    const r = svg.getBoundingClientRect(), vb = svg.viewBox.baseVal, s = vb && vb.width ? vb.width / r.width : 1;
    view = { ...view, x: drag.vx + dx * s, y: drag.vy + dy * s };
    applyView();
  }
  function onUp() { if (drag && drag.moved) dragged = true; drag = null; stage.classList.remove("panning"); }
  function onReset() { view = { k: 1, x: 0, y: 0 }; applyView(); }

  const onHighlight = () => paintHighlight();
  const onDcn = () => paintDcn();
  const onSelected = () => paintSelected();
  const onStatus = () => paintStatus();
  const onIci = () => draw();
  model.on("msg:custom", onMsg);
  model.on("change:geometry", onGeometry);
  model.on("change:highlight", onHighlight);
  model.on("change:dcn", onDcn);
  model.on("change:selected", onSelected);
  model.on("change:status", onStatus);
  ici.addEventListener("change", onIci);
  reset.addEventListener("click", onReset);
  stage.addEventListener("mousemove", onMove);
  stage.addEventListener("mouseleave", onLeave);
  stage.addEventListener("click", onClick);
  stage.addEventListener("wheel", onWheel, { passive: false });
  stage.addEventListener("pointerdown", onDown);
  window.addEventListener("pointermove", onDragMove);
  window.addEventListener("pointerup", onUp);

  draw();
  askFull();
  if (resized) resized.observe(stage);

  return () => {
    model.off("msg:custom", onMsg);
    model.off("change:geometry", onGeometry);
    model.off("change:highlight", onHighlight);
    model.off("change:dcn", onDcn);
    model.off("change:selected", onSelected);
    model.off("change:status", onStatus);
    window.removeEventListener("pointermove", onDragMove);
    window.removeEventListener("pointerup", onUp);
    if (resized) resized.disconnect();
    root.remove();
  };
}

export default { render };
