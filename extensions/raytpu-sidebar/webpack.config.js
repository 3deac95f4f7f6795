// Merged into JupyterLab's build (package.json "jupyterlab.webpackConfig"): the topology map's
// drawing code is the anywidget's own module in the Python package, imported, never copied.
const path = require('path');

module.exports = {
  resolve: {
    alias: {
      'raytpu-topology-map': path.resolve(__dirname, '../../raytpu_lab/widgets/topology_map.js')
    }
  }
};
