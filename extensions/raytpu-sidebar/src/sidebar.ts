// The "Ray TPU" sidebar: cluster picker, health, slices, live map, reservations (Release), runs
// (Stop), idle meter and what fits now. Plain DOM; every number comes from the server's feed.
import { Widget } from '@lumino/widgets';
import { Drag } from '@lumino/dragdrop';
import { MimeData } from '@lumino/coreutils';
import { api, post } from './api';
import { acquire, release, ClusterStore, MapModel, Panels } from './store';
import topologyMap from 'raytpu-topology-map';

export const CELL_MIME = 'application/vnd.raytpu.cell';

function el<K extends keyof HTMLElementTagNameMap>(tag: K, attrs: Record<string, string> = {}, text = ''): HTMLElementTagNameMap[K] {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text) e.textContent = text;
  return e;
}

function age(since: number): string {
  const s = Math.max(0, Date.now() / 1000 - since);
  if (s < 60) return `${Math.round(s)} s`;
  if (s < 3600) return `${Math.round(s / 60)} min`;
  return `${(s / 3600).toFixed(1)} h`;
}

// A live map of one cluster, drawn by raytpu_lab/widgets/topology_map.js.
export class MapView {
  readonly model: MapModel;
  private cleanup: (() => void) | void;
  constructor(readonly store: ClusterStore, host: HTMLElement) {
    this.model = new MapModel(store);
    this.cleanup = topologyMap.render({ model: this.model, el: host });
  }
  dispose(): void {
    if (this.cleanup) this.cleanup();
    this.model.dispose();
  }
}

export class RaytpuSidebar extends Widget {
  clusterId = '';
  store: ClusterStore | null = null;
  private map: MapView | null = null;
  private clusters: any[] = [];
  private picker = el('select', { class: 'raytpu-cluster-picker' });
  private body = el('div', { class: 'raytpu-body' });
  private summary = el('div', { class: 'raytpu-summary' });
  private error = el('div', { class: 'raytpu-error' });
  private slices = el('table', { class: 'raytpu-slices' });
  private mapHost = el('div', { class: 'raytpu-map-host' });
  private selection = el('div', { class: 'raytpu-selection' });
  private reservations = el('table', { class: 'raytpu-reservations' });
  private runs = el('table', { class: 'raytpu-runs' });
  private idle = el('div', { class: 'raytpu-idle' });
  private fits = el('table', { class: 'raytpu-fits' });
  private message = el('div', { class: 'raytpu-message' });
  private selected: any = {};

  constructor(private openMap: (clusterId: string) => void) {
    super();
    this.id = 'raytpu-sidebar';
    this.addClass('raytpu-sidebar');
    this.title.caption = 'Ray TPU';
    const head = el('div', { class: 'raytpu-head' });
    const refresh = el('button', { class: 'raytpu-refresh', title: 'Look for clusters again' }, '↻');
    refresh.onclick = () => void this.refreshClusters();
    const open = el('button', { class: 'raytpu-open-map', title: 'Open the map in the main area' }, 'Open map');
    open.onclick = () => this.clusterId && this.openMap(this.clusterId);
    this.picker.onchange = () => this.pick(this.picker.value);
    head.append(el('span', { class: 'raytpu-title' }, 'Ray TPU'), this.picker, refresh, open);
    const section = (title: string, ...children: HTMLElement[]) => {
      const s = el('section', { class: 'raytpu-section' });
      s.append(el('h3', {}, title), ...children);
      return s;
    };
    this.body.append(
      this.summary, this.error,
      section('Slices', this.slices),
      section('Map', this.mapHost, this.selection),
      section('Reservations (every owner)', this.reservations),
      section('Runs', this.runs),
      section('Idle chips', this.idle),
      section('What fits now', this.fits));
    this.node.append(head, this.message, this.body);
    void this.refreshClusters();
  }

  async refreshClusters(): Promise<void> {
    try {
      const out = await api('clusters');
      this.clusters = out.clusters || [];
      this.message.textContent = this.clusters.length ? '' : 'No cluster: start an emulated one (command palette: "Ray TPU: Start an emulated cluster") or set $RAY_ADDRESS.';
    } catch (err: any) {
      this.message.textContent = `Cannot list clusters: ${err.message}`;
      return;
    }
    this.picker.replaceChildren(...this.clusters.map(c => el('option', { value: c.id }, c.label)));
    const keep = this.clusters.find(c => c.id === this.clusterId);
    const next = keep ? keep.id : this.clusters.length ? this.clusters[0].id : '';
    this.picker.value = next;
    if (next !== this.clusterId || !this.store) this.pick(next);
  }

  cluster(): any {
    return this.clusters.find(c => c.id === this.clusterId);
  }

  pick(clusterId: string): void {
    if (this.map) this.map.dispose();
    this.map = null;
    if (this.store) release(this.store);
    this.store = null;
    this.clusterId = clusterId;
    this.mapHost.replaceChildren();
    this.body.style.display = clusterId ? '' : 'none';
    if (!clusterId) return;
    this.store = acquire(clusterId);
    this.store.changed.connect((_, panels) => this.draw(panels), this);
    this.map = new MapView(this.store, this.mapHost);
    this.map.model.on('change:selected', (sel: any) => {
      this.selected = sel || {};
      if (this.store) this.draw(this.store.panels);
    });
    this.draw(this.store.panels);
  }

  private draw(p: Panels): void {
    const s = p.summary;
    this.error.textContent = p.error || '';
    if (s) {
      const states = Object.entries(s.by_state || {}).map(([k, v]) => `${v} ${k}`).join(', ');
      this.summary.textContent = `${s.slices} slices (${states || 'none'}) · hosts ${s.hosts_alive}/${s.hosts_expected} · chips free ${s.chips_free}/${s.chips_total}` + (s.pending && s.pending.length ? ` · pending: ${s.pending.join(', ')}` : '');
    } else {
      this.summary.textContent = 'waiting for the first poll…';
    }
    this.drawSlices(p);
    this.drawSelection(p);
    this.drawReservations(p);
    this.drawRuns(p);
    this.drawIdle(p);
    this.drawFits(p);
  }

  private table(t: HTMLTableElement, head: string[], rows: HTMLTableRowElement[], empty: string): void {
    const hr = el('tr');
    for (const h of head) hr.append(el('th', {}, h));
    t.replaceChildren(hr, ...rows);
    if (!rows.length) {
      const r = el('tr', { class: 'raytpu-empty' });
      const td = el('td', { colspan: String(head.length) }, empty);
      r.append(td);
      t.append(r);
    }
  }

  private drawSlices(p: Panels): void {
    const byRes = new Set((p.reservations || []).map((r: any) => r.name));
    const rows = p.slices.map((s: any) => {
      const tr = el('tr', { 'data-slice': s.name, 'data-state': s.state, class: 'raytpu-slice-row' });
      tr.append(el('td', {}, s.name), el('td', {}, s.pod_type), el('td', {}, s.topology),
        el('td', {}, `${s.hosts_alive}/${s.hosts_expected}`), el('td', { class: 'raytpu-state' }, s.state),
        el('td', {}, (s.holders || []).join(', ')));
      const holder = (s.holders || []).find((h: string) => byRes.has(h));
      const [version] = String(s.pod_type).split('-');
      const cell = holder ? `%%raytpu run --on ${holder}\n` : `%raytpu reserve ${s.topology} --version ${version}`;
      this.draggable(tr, cell);
      tr.onclick = () => this.map && this.map.model.set('selected', { slice: s.name });
      return tr;
    });
    this.table(this.slices, ['slice', 'pod type', 'topology', 'hosts', 'state', 'held by'], rows, 'no TPU slice');
  }

  private drawSelection(p: Panels): void {
    const name = this.selected && this.selected.slice;
    const s = name && p.slices.find((x: any) => x.name === name);
    if (!s) {
      this.selection.textContent = 'Click a slice for its hosts, reservation and run.';
      return;
    }
    const res = (p.reservations || []).filter((r: any) => (r.slices || []).includes(name)).map((r: any) => r.name);
    const runs = (p.runs || []).filter((r: any) => (r.slices || []).includes(name) && (r.state === 'running' || r.state === 'stopping')).map((r: any) => r.name);
    const host = this.selected.worker !== undefined ? ` · host ${this.selected.worker}${this.selected.node_id ? ' (node ' + String(this.selected.node_id).slice(0, 8) + ')' : ''}` : '';
    this.selection.textContent = `${s.name}: ${s.pod_type} ${s.topology}, hosts ${s.hosts_alive}/${s.hosts_expected}, ${s.state}${host} · reservation: ${res.join(', ') || 'none'} · run: ${runs.join(', ') || 'none'}`;
  }

  private drawReservations(p: Panels): void {
    const idle = (p.idle && p.idle.reservations) || {};
    const rows = (p.reservations || []).map((r: any) => {
      const tr = el('tr', { 'data-reservation': r.name, class: 'raytpu-reservation-row' });
      const u = idle[r.name];
      const meter = u ? `${u.held_chip_h} / ${u.idle_chip_h}` : '';
      const btn = el('button', { class: 'raytpu-release', 'data-reservation': r.name }, 'Release');
      btn.onclick = ev => {
        ev.stopPropagation();
        void this.act(btn, `clusters/${this.clusterId}/reservations/${encodeURIComponent(r.name)}/release`);
      };
      const name = el('td', {}, r.name);
      if (u && u.nudge) {
        name.append(el('span', { class: 'raytpu-nudge', title: `idle ${u.idle_min} min` }, ` idle ${u.idle_min} min`));
        tr.classList.add('raytpu-idle-nudge');
      }
      const act = el('td');
      act.append(btn);
      tr.append(name, el('td', {}, r.owner), el('td', {}, age(r.since)), el('td', {}, String(r.chips)),
        el('td', { title: 'chip-hours held / idle' }, meter), act);
      this.draggable(tr, `%raytpu attach ${r.name}`);
      return tr;
    });
    this.table(this.reservations, ['name', 'owner', 'age', 'chips', 'chip-h held/idle', ''], rows, 'no reservation');
  }

  private drawRuns(p: Panels): void {
    const rows = (p.runs || []).map((r: any) => {
      const tr = el('tr', { 'data-run': r.name, 'data-state': r.state, class: 'raytpu-run-row' });
      const act = el('td');
      if (r.state === 'running') {
        const btn = el('button', { class: 'raytpu-stop', 'data-run': r.name }, 'Stop');
        btn.onclick = () => void this.act(btn, `clusters/${this.clusterId}/runs/${encodeURIComponent(r.key)}/stop`);
        act.append(btn);
      }
      tr.append(el('td', {}, r.name), el('td', {}, r.trainer), el('td', { class: 'raytpu-state' }, r.state),
        el('td', {}, Number(r.steps_per_s || 0).toFixed(2)), el('td', {}, (r.slices || []).join(', ')), act);
      return tr;
    });
    this.table(this.runs, ['run', 'trainer', 'state', 'steps/s', 'slices', ''], rows, 'no run');
  }

  private drawIdle(p: Panels): void {
    const i = p.idle;
    if (!i) {
      this.idle.textContent = '';
      return;
    }
    const nudges = Object.entries(i.reservations || {}).filter(([, u]: any) => u.nudge).map(([n]) => n);
    this.idle.textContent = `cluster: ${i.total.held_chip_h} chip-h held, ${i.total.idle_chip_h} idle` +
      (nudges.length ? ` · idle over ${Math.round(i.idle_after_s / 60)} min: ${nudges.join(', ')} (Release?)` : '');
  }

  private drawFits(p: Panels): void {
    const rows = (p.fits || []).map((f: any) => {
      const tr = el('tr', { 'data-topology': `${f.version}:${f.topology}`, class: f.fits ? 'raytpu-fits-yes' : 'raytpu-fits-no' });
      tr.append(el('td', {}, `${f.version} ${f.topology}`), el('td', {}, String(f.chips)), el('td', {}, String(f.fits)), el('td', {}, f.why));
      return tr;
    });
    this.table(this.fits, ['shape', 'chips', 'fits', 'why not'], rows, 'no TPU generation on this cluster');
  }

  private async act(btn: HTMLButtonElement, path: string): Promise<void> {
    btn.disabled = true;
    try {
      await post(path);
      this.message.textContent = '';
    } catch (err: any) {
      this.message.textContent = err.message;
      btn.disabled = false;
    }
  }

  // Drag a row into a notebook: the plugin's drop handler inserts `text` as a new cell.
  private draggable(row: HTMLElement, text: string): void {
    row.classList.add('raytpu-draggable');
    row.title = `drag into a notebook: ${text.trim()}`;
    row.addEventListener('pointerdown', (ev: PointerEvent) => {
      if (ev.button !== 0 || (ev.target as HTMLElement).closest('button')) return;
      const x0 = ev.clientX, y0 = ev.clientY;
      const move = (e: PointerEvent) => {
        if (Math.hypot(e.clientX - x0, e.clientY - y0) < 5) return;
        done();
        window.getSelection()?.removeAllRanges();  // a drag is not a text selection
        const mime = new MimeData();
        mime.setData(CELL_MIME, text);
        mime.setData('text/plain', text);
        const image = el('div', { class: 'raytpu-drag-image' }, text.trim());
        const drag = new Drag({ mimeData: mime, dragImage: image, proposedAction: 'copy', supportedActions: 'copy', source: this });
        void drag.start(e.clientX, e.clientY);
      };
      const done = () => {
        document.removeEventListener('pointermove', move);
        document.removeEventListener('pointerup', done);
      };
      document.addEventListener('pointermove', move);
      document.addEventListener('pointerup', done);
    });
  }

  dispose(): void {
    if (this.map) this.map.dispose();
    if (this.store) release(this.store);
    super.dispose();
  }
}
