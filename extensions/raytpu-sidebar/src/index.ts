// raytpu-sidebar: the "Ray TPU" left-area panel, a main-area map (restored on reload), command
// palette entries to start/stop an emulated cluster, and drops of sidebar rows into notebooks.
import { ILayoutRestorer, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ICommandPalette, InputDialog, MainAreaWidget, WidgetTracker, showErrorMessage } from '@jupyterlab/apputils';
import { INotebookTracker, NotebookActions, NotebookPanel } from '@jupyterlab/notebook';
import { LabIcon } from '@jupyterlab/ui-components';
import { api, post } from './api';
import { RaytpuMapWidget } from './mapwidget';
import { CELL_MIME, RaytpuSidebar } from './sidebar';

const ICON = new LabIcon({
  name: 'raytpu:icon',
  svgstr: '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24"><g class="jp-icon3" fill="#616161"><rect x="3" y="3" width="8" height="8" rx="1"/><rect x="13" y="3" width="8" height="8" rx="1"/><rect x="3" y="13" width="8" height="8" rx="1"/><rect x="13" y="13" width="8" height="8" rx="1" opacity=".5"/></g></svg>'
});

const CMD = {
  open: 'raytpu:open-map',
  up: 'raytpu:start-emulated',
  down: 'raytpu:stop-emulated',
  refresh: 'raytpu:refresh'
};

function acceptDrops(panel: NotebookPanel): void {
  const node = panel.content.node;
  const ours = (e: any) => e.mimeData && e.mimeData.hasData(CELL_MIME);
  const accept = (e: any) => {
    if (!ours(e)) return;
    e.preventDefault();
    e.stopPropagation();
    e.dropAction = 'copy';
  };
  node.addEventListener('lm-dragenter', accept, true);
  node.addEventListener('lm-dragover', accept, true);
  node.addEventListener('lm-drop', (e: any) => {
    if (!ours(e)) return;
    e.preventDefault();
    e.stopPropagation();
    e.dropAction = 'copy';
    const notebook = panel.content;
    NotebookActions.insertBelow(notebook);
    const cell = notebook.activeCell;
    if (cell) cell.model.sharedModel.setSource(String(e.mimeData.getData(CELL_MIME)));
  }, true);
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'raytpu-sidebar:plugin',
  description: 'The Ray TPU sidebar: clusters, slices, reservations and runs of raytpu_lab.',
  autoStart: true,
  optional: [ILayoutRestorer, ICommandPalette, INotebookTracker],
  activate: (app: JupyterFrontEnd, restorer: ILayoutRestorer | null, palette: ICommandPalette | null,
    notebooks: INotebookTracker | null) => {
    const tracker = new WidgetTracker<MainAreaWidget<RaytpuMapWidget>>({ namespace: 'raytpu-map' });
    const openMap = (clusterId: string) => {
      const existing = tracker.find(w => w.content.clusterId === clusterId);
      if (existing) {
        app.shell.activateById(existing.id);
        return existing;
      }
      const widget = new MainAreaWidget({ content: new RaytpuMapWidget(clusterId) });
      widget.id = `raytpu-map-main-${clusterId}`;
      widget.title.label = `Ray TPU: ${clusterId}`;
      widget.title.icon = ICON;
      void tracker.add(widget);
      app.shell.add(widget, 'main');
      app.shell.activateById(widget.id);
      return widget;
    };

    const sidebar = new RaytpuSidebar(id => void app.commands.execute(CMD.open, { cluster: id }));
    sidebar.title.icon = ICON;
    app.shell.add(sidebar, 'left', { rank: 850 });
    if (restorer) {
      restorer.add(sidebar, 'raytpu-sidebar');
      void restorer.restore(tracker, {
        command: CMD.open,
        args: w => ({ cluster: w.content.clusterId }),
        name: w => w.content.clusterId
      });
    }

    app.commands.addCommand(CMD.open, {
      label: 'Ray TPU: Open the topology map in the main area',
      execute: args => {
        const id = String(args.cluster || sidebar.clusterId || '');
        if (!id) return;
        return openMap(id);
      }
    });
    app.commands.addCommand(CMD.refresh, {
      label: 'Ray TPU: Look for clusters again',
      execute: () => sidebar.refreshClusters()
    });
    app.commands.addCommand(CMD.up, {
      label: 'Ray TPU: Start an emulated cluster',
      execute: async () => {
        const name = await InputDialog.getText({ title: 'Emulated cluster name', text: 'raytpu' });
        if (!name.button.accept || !name.value) return;
        const tpu = await InputDialog.getText({ title: 'Slice shape (version:topology)', text: 'v4:2x2x2' });
        if (!tpu.button.accept || !tpu.value) return;
        try {
          await post('clusters', { name: name.value, tpu: tpu.value, slices: 1 });
        } catch (err: any) {
          await showErrorMessage('Ray TPU: start failed', err.message);
        }
        await sidebar.refreshClusters();
      }
    });
    app.commands.addCommand(CMD.down, {
      label: 'Ray TPU: Stop the selected emulated cluster',
      isEnabled: () => !!sidebar.cluster() && sidebar.cluster().kind === 'emulated',
      execute: async () => {
        const c = sidebar.cluster();
        if (!c) return;
        try {
          await api(`clusters/${c.id}`, { method: 'DELETE' });
        } catch (err: any) {
          await showErrorMessage('Ray TPU: stop failed', err.message);
        }
        await sidebar.refreshClusters();
      }
    });
    if (palette) {
      for (const command of Object.values(CMD)) palette.addItem({ command, category: 'Ray TPU' });
    }
    if (notebooks) {
      notebooks.widgetAdded.connect((_, panel) => acceptDrops(panel));
      notebooks.forEach(panel => acceptDrops(panel));
    }
  }
};

export default plugin;
