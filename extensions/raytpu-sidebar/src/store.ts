// One cluster's state in this browser tab: a long poll on /updates (the server polls Ray once per
// interval for every tab), the sidebar's panels, and the map models fed with the server's own
// map messages (full/delta, raytpu_lab/_protocols.py), drawn by raytpu_lab/widgets/topology_map.js.
import { Signal } from '@lumino/signaling';
import { api } from './api';

export type Panels = {
  summary: any;
  slices: any[];
  reservations: any[];
  runs: any[];
  idle: any;
  fits: any[];
  error: string;
  fetched_at: number;
};

type Listener = (...args: any[]) => void;

// The anywidget model interface topology_map.js's render() uses: get/set/save_changes/on/off/send.
export class MapModel {
  private listeners = new Map<string, Set<Listener>>();
  private values: Record<string, any> = { geometry: {}, highlight: [], dcn: [], status: '', selected: {} };

  constructor(private store: ClusterStore) {
    store.models.add(this);
    this.values.geometry = store.geometry;
  }

  get(name: string): any {
    return this.values[name];
  }
  set(name: string, value: any): void {
    this.values[name] = value;
    this.emit('change:' + name, value);
  }
  save_changes(): void {
    /* nothing synced back to a kernel */
  }
  on(event: string, cb: Listener): void {
    if (!this.listeners.has(event)) this.listeners.set(event, new Set());
    this.listeners.get(event)!.add(cb);
  }
  off(event: string, cb?: Listener): void {
    if (cb) this.listeners.get(event)?.delete(cb);
    else this.listeners.delete(event);
  }
  emit(event: string, ...args: any[]): void {
    for (const cb of Array.from(this.listeners.get(event) || [])) cb(...args);
  }
  send(msg: any): void {
    if (msg && msg.type === 'request_full') this.store.resync();
    else if (msg && msg.type === 'details') this.store.details(this, msg.slice, msg.worker);
  }
  dispose(): void {
    this.store.models.delete(this);
    this.listeners.clear();
  }
}

export class ClusterStore {
  readonly changed = new Signal<this, Panels>(this);
  readonly models = new Set<MapModel>();
  geometry: any = {};
  panels: Panels = { summary: null, slices: [], reservations: [], runs: [], idle: null, fits: [], error: '', fetched_at: 0 };
  rev = -1;
  private stopped = false;
  private lastFullMap: any = null;
  private resyncing: Promise<void> | null = null;
  private waitMs = 20000;

  constructor(readonly clusterId: string) {
    void this.loop();
  }

  dispose(): void {
    this.stopped = true;
    for (const m of Array.from(this.models)) m.dispose();
  }

  private async loop(): Promise<void> {
    while (!this.stopped) {
      try {
        const out = await api(`clusters/${this.clusterId}/updates?since=${this.rev}&timeout=${this.waitMs / 1000}`);
        if (this.stopped) return;
        this.take(out);
      } catch (err: any) {
        if (this.stopped) return;
        this.panels = { ...this.panels, error: String(err.message || err) };
        this.changed.emit(this.panels);
        await new Promise(r => setTimeout(r, 2000));
      }
    }
  }

  private take(out: any): void {
    if (out.type === 'full') {
      this.applyFull(out);
    } else {
      for (const u of out.updates || []) this.applyUpdate(u);
      this.rev = out.rev;
    }
    this.changed.emit(this.panels);
  }

  private applyFull(full: any): void {
    this.rev = full.rev;
    this.panels = {
      summary: full.summary, slices: full.slices || [], reservations: full.reservations || [],
      runs: full.runs || [], idle: full.idle, fits: full.fits || [], error: full.error || '',
      fetched_at: full.fetched_at
    };
    this.geometry = full.geometry || {};
    this.lastFullMap = full.map;
    for (const m of this.models) {
      if ((m.get('geometry') || {}).rev !== this.geometry.rev) m.set('geometry', this.geometry);
      if (full.map) m.emit('msg:custom', full.map);
    }
  }

  private applyUpdate(u: any): void {
    const p = { ...this.panels, fetched_at: u.fetched_at };
    for (const k of ['summary', 'reservations', 'runs', 'idle', 'fits', 'error']) {
      if (k in u) (p as any)[k] = u[k];
    }
    if (u.slices) {
      if (Array.isArray(u.slices)) {
        const rows = p.slices.slice();
        for (const [i, row] of u.slices) rows[i] = row;
        p.slices = rows;
      } else {
        p.slices = u.slices.all;
      }
    }
    this.panels = p;
    if (u.geometry) {
      this.geometry = u.geometry;
      for (const m of this.models) {
        if ((m.get('geometry') || {}).rev !== this.geometry.rev) m.set('geometry', this.geometry);
      }
    }
    for (const msg of u.map || []) {
      if (msg.type === 'full') this.lastFullMap = msg;
      for (const m of this.models) m.emit('msg:custom', msg);
    }
  }

  // A map view asked for the whole state (on render, or a delta it could not apply).
  resync(): void {
    if (this.resyncing) return;
    this.resyncing = (async () => {
      try {
        const full = await api(`clusters/${this.clusterId}/snapshot`);
        if (!this.stopped && full.type === 'full') {
          this.applyFull(full);
          this.changed.emit(this.panels);
        }
      } catch (err: any) {
        if (this.lastFullMap) for (const m of this.models) m.emit('msg:custom', this.lastFullMap);
      } finally {
        this.resyncing = null;
      }
    })();
  }

  async details(model: MapModel, slice: string, worker: number): Promise<void> {
    try {
      const d = await api(`clusters/${this.clusterId}/details?slice=${encodeURIComponent(slice)}&worker=${worker}`);
      model.emit('msg:custom', d);
    } catch {
      /* hover details are best effort */
    }
  }
}

const stores = new Map<string, { store: ClusterStore; users: number }>();

// One store per cluster per tab, shared by the sidebar and every main-area map.
export function acquire(clusterId: string): ClusterStore {
  let entry = stores.get(clusterId);
  if (!entry) {
    entry = { store: new ClusterStore(clusterId), users: 0 };
    stores.set(clusterId, entry);
  }
  entry.users += 1;
  return entry.store;
}

export function release(store: ClusterStore): void {
  const entry = stores.get(store.clusterId);
  if (!entry || entry.store !== store) return;
  entry.users -= 1;
  if (entry.users <= 0) {
    store.dispose();
    stores.delete(store.clusterId);
  }
}
