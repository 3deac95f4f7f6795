// The map of one cluster in the main area (restored on reload by the layout restorer).
import { Widget } from '@lumino/widgets';
import { acquire, release, ClusterStore } from './store';
import { MapView } from './sidebar';

export class RaytpuMapWidget extends Widget {
  private store: ClusterStore;
  private view: MapView;
  constructor(readonly clusterId: string) {
    super();
    this.id = `raytpu-map-${clusterId}`;
    this.addClass('raytpu-main-map');
    this.title.label = `Ray TPU map: ${clusterId}`;
    this.title.closable = true;
    const host = document.createElement('div');
    host.className = 'raytpu-main-map-host';
    this.node.append(host);
    this.store = acquire(clusterId);
    this.view = new MapView(this.store, host);
  }
  dispose(): void {
    this.view.dispose();
    release(this.store);
    super.dispose();
  }
}
