// The topology map's drawing code, raytpu_lab/widgets/topology_map.js (the anywidget's ES module),
// resolved by webpack's alias in ../webpack.config.js: imported, never copied.
declare module 'raytpu-topology-map' {
  const mod: { render(ctx: { model: any; el: HTMLElement }): (() => void) | void };
  export default mod;
}
