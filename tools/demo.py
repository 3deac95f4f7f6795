"""Run the quickstart notebook headless on the emulated TPU cluster and report what it measured.

``python -m tools.demo`` (what ``make demo`` runs) executes ``notebooks/01_quickstart.ipynb``
with nbclient, writes ``build/quickstart.ipynb`` (executed) and ``build/quickstart.html`` (static:
the SVG topology inline, plotly.js once per page for every chart, so it renders offline), always
stops the emulated cluster the notebook started, and prints as its last line ``RESULT {json}``:
the dict from the cell tagged ``demo-result`` plus ``wall_s``. Exit status: 0 ok, 1 failed cell or
no result, 130 on Ctrl-C.

The executed notebook holds no widget state (every live view of a run is replaced by its static
bundle when the run ends) and no plotly.js: charts are ``application/vnd.plotly.v1+json`` +
``image/svg+xml``. :func:`export_html` (its :class:`PlotlyOncePreprocessor` and template) turns
those into interactive plotly charts sharing one copy of plotly.js in the page.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import nbformat
import zmq
from jinja2 import DictLoader
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import AsyncKernelManager
from jupyter_core.utils import ensure_async
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError
from nbconvert import HTMLExporter
from nbconvert.preprocessors import Preprocessor
from traitlets import default

from raytpu_lab.cluster import emulator
from raytpu_lab.widgets.svg import inline_svg_imgs

PLOTLY_MIME = "application/vnd.plotly.v1+json"

__all__ = ["main", "read_result", "export_html", "PlotlyOncePreprocessor", "RESULT_TAG",
           "RESULT_KEYS"]

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULT_TAG = "demo-result"
RESULT_KEYS = ("slice", "hosts", "devices", "loss_first", "loss_last", "steps_per_s")
CELL_TIMEOUT_S = 600
UP_TIMEOUT_ENV = "RAYTPU_UP_TIMEOUT_S"
"""Default of ``%raytpu up --timeout`` (seconds) in kernels started with it set."""

# The lab template loads require.js, MathJax and mermaid from a CDN (and the widget manager from
# unpkg when widget state is saved). Offline they fail; online, require.js makes plotly.js's inline
# UMD bundle register as an anonymous AMD module, so ``window.Plotly`` is never set and the chart
# stays blank. Without those blocks the page loads no external script. The lab template also shows
# image/svg+xml as an <img> data URI (its ``skip_svg_encoding`` runs bleach, which escapes <svg>);
# we inline the SVG itself so its ids and <title> tooltips work in the page.
_OFFLINE_TEMPLATE = """{%- extends 'lab/index.html.j2' -%}
{%- block html_head_js_requirejs -%}{%- endblock html_head_js_requirejs -%}
{%- block jupyter_widgets -%}{%- endblock jupyter_widgets -%}
{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}
{%- block html_head_js_mermaidjs -%}
{%- if resources.raytpu_plotlyjs -%}<script type="text/javascript">{{ resources.raytpu_plotlyjs }}</script>{%- endif -%}
{%- endblock html_head_js_mermaidjs -%}
{%- block data_svg -%}
<div class="jp-RenderedSVG jp-OutputArea-output {{ extra_class }}" data-mime-type="image/svg+xml">
{{ output.data['image/svg+xml'] }}
</div>
{%- endblock data_svg -%}
"""


class _VenvKernelManager(AsyncKernelManager):  # type: ignore[misc]
    """Kernel ``python3`` that always runs in this interpreter (``sys.executable``).

    With no kernelspec folders to search, ``python3`` resolves to ipykernel's built-in spec, whose
    argv starts with ``sys.executable``: a ``python3`` kernelspec in ``~/.local/share/jupyter`` or
    ``/usr/share/jupyter`` (maybe another Python, without raytpu_lab) can't shadow it, and nothing
    needs installing first.
    """

    @default("kernel_spec_manager")
    def _default_kernel_spec_manager(self) -> KernelSpecManager:
        return KernelSpecManager(kernel_dirs=[])

    @default("transport_encryption")  # jupyter_client >= 8.8; ipykernel 7 warns about plain TCP
    def _default_transport_encryption(self) -> str:
        return "auto" if zmq.has("curve") else "disabled"


def read_result(nb: nbformat.NotebookNode) -> dict[str, Any]:
    """The dict shown by the code cell tagged ``demo-result`` (JSON, or a Python dict repr)."""
    for cell in nb.cells:
        if cell.cell_type != "code" or RESULT_TAG not in cell.get("metadata", {}).get("tags", []):
            continue
        for out in reversed(cell.get("outputs", [])):
            data = out.get("data", {})
            if isinstance(data.get("application/json"), dict):
                return dict(data["application/json"])
            text = data.get("text/plain") or (
                out.get("text") if out.get("name") == "stdout" else ""
            )
            for chunk in [text, *reversed(text.splitlines())] if text else []:
                for parse in (json.loads, ast.literal_eval):
                    try:
                        value = parse(chunk.strip())
                    except (ValueError, SyntaxError):
                        continue
                    if isinstance(value, dict):
                        return value
    raise LookupError(f"no code cell tagged {RESULT_TAG!r} shows a dict")


class PlotlyOncePreprocessor(Preprocessor):  # type: ignore[misc]
    """For a static HTML page: each plotly chart output becomes a ``<div>`` drawn by
    ``Plotly.newPlot``, with plotly.js put once in the page's head (``resources
    ["raytpu_plotlyjs"]``, used by the template of :func:`export_html`); each SVG ``<img>`` of
    raytpu_lab in ``text/html`` is inlined (its hover titles work in a page)."""

    def preprocess(self, nb: nbformat.NotebookNode, resources: dict[str, Any]
                   ) -> tuple[nbformat.NotebookNode, dict[str, Any]]:
        charts = 0
        for cell in nb.cells:
            for out in cell.get("outputs", []):
                data = out.get("data", {})
                if "text/html" in data:
                    data["text/html"] = inline_svg_imgs("".join(data["text/html"]))
                fig = data.get(PLOTLY_MIME)
                if not isinstance(fig, dict):
                    continue
                charts += 1
                div = f"raytpu-plotly-{charts}"
                spec = json.dumps({k: fig.get(k, {}) for k in ("data", "layout", "config")})
                spec = spec.replace("</", "<\\/")  # no "</script>" inside the script
                out["data"] = {"text/html": (
                    f'<div id="{div}" class="raytpu-plotly"></div><script type="text/javascript">'
                    f'(function(){{var f={spec};Plotly.newPlot("{div}",f.data,f.layout,f.config);'
                    "})();</script>"), "text/plain": data.get("text/plain", "")}
        if charts:
            from plotly.offline import get_plotlyjs

            resources["raytpu_plotlyjs"] = get_plotlyjs()
        return nb, resources


def export_html(nb: nbformat.NotebookNode, path: Path) -> None:
    """Write ``nb`` as a JupyterLab-styled HTML page that loads no external script (plotly.js,
    when a chart needs it, is inline once)."""
    loader = DictLoader({"raytpu_offline.html.j2": _OFFLINE_TEMPLATE})
    exporter = HTMLExporter(
        template_name="lab", template_file="raytpu_offline.html.j2", extra_loaders=[loader]
    )
    exporter.register_preprocessor(PlotlyOncePreprocessor(), enabled=True)
    path.write_text(exporter.from_notebook_node(nb)[0], encoding="utf-8")


def _first_line(text: str, width: int) -> str:
    return (text.strip().splitlines() or [""])[0][:width]


def _execute(nb: nbformat.NotebookNode, cwd: Path) -> str | None:
    """Run every cell; return None, or what failed. Raises KeyboardInterrupt on Ctrl-C / SIGTERM."""
    code = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    state: dict[str, Any] = {"index": -1, "interrupted": False}
    client: NotebookClient

    def on_signal() -> None:  # kill the kernel: the running cell ends with DeadKernelError
        state["interrupted"] = True
        if client.km is not None:
            asyncio.ensure_future(ensure_async(client.km.shutdown_kernel(now=True)))

    def on_start(cell: nbformat.NotebookNode, cell_index: int) -> None:
        if state["index"] < 0:  # inside nbclient's loop: replace its handlers (they crash on exit)
            for sig in (signal.SIGINT, signal.SIGTERM):
                asyncio.get_running_loop().add_signal_handler(sig, on_signal)
        state["index"] = cell_index
        if cell_index in code:
            step = f"[{code.index(cell_index) + 1}/{len(code)}]"
            print(step, _first_line(cell.source, 80), flush=True)

    client = NotebookClient(
        nb,
        timeout=CELL_TIMEOUT_S,
        kernel_name="python3",
        kernel_manager_class=_VenvKernelManager,
        shutdown_kernel="immediate",
        store_widget_state=False,  # runs' live views are replaced by static bundles at their end
        resources={"metadata": {"path": str(cwd)}},
        on_cell_start=on_start,
    )
    try:
        client.execute()
    except Exception as exc:
        if state["interrupted"]:
            raise KeyboardInterrupt from exc
        i = state["index"]
        why = f"{exc.ename}: {exc.evalue}" if isinstance(exc, CellExecutionError) else repr(exc)
        where = f"cell {i + 1}/{len(nb.cells)} ({_first_line(nb.cells[i].source, 80)})"
        # The whole message: raytpu_lab's errors say what, why, what to do and where logs are kept.
        return f"{where if i >= 0 else 'kernel start'}: {_tail(why, 60)}"
    finally:
        signal.signal(signal.SIGTERM, signal.default_int_handler)  # nbclient leaves it SIG_DFL
    if state["interrupted"]:
        raise KeyboardInterrupt
    return None


def _tail(text: str, lines: int) -> str:
    """``text`` without terminal colour codes, at most its last ``lines`` lines."""
    import re

    kept = re.sub(r"\x1b\[[0-9;]*m", "", text).strip().splitlines()
    return "\n".join((["..."] if len(kept) > lines else []) + kept[-lines:])


def _teardown(head_pid_before: int | None) -> None:
    cluster = emulator.find(emulator.DEFAULT_NAME)
    if cluster is not None and cluster.head_pid == head_pid_before:
        print(f"emulated cluster {cluster.name!r} was up before the demo: left running", flush=True)
    elif cluster is not None:
        cluster.down()
        print(f"stopped emulated cluster {cluster.name!r}", flush=True)


def main(argv: list[str] | None = None) -> int:
    """Run the notebook, export it, tear down, print ``RESULT {json}``; return the exit status."""
    start = time.monotonic()
    default_nb = REPO_ROOT / "notebooks" / "01_quickstart.ipynb"
    parser = argparse.ArgumentParser("python -m tools.demo", description=main.__doc__)
    parser.add_argument("--notebook", type=Path, default=default_nb, help="notebook to run")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "build", help="output folder")
    parser.add_argument("--timeout", type=float, default=None,
                        help="seconds %%raytpu up waits for every emulated node (default 180)")
    args = parser.parse_args(argv)
    if args.timeout is not None:
        if not args.timeout > 0:
            parser.error(f"--timeout {args.timeout:g}: it must be above 0")
        # The notebook's kernel inherits it: %raytpu up's default --timeout.
        os.environ[UP_TIMEOUT_ENV] = str(args.timeout)
    notebook: Path = args.notebook.resolve()
    stem = "quickstart" if notebook == default_nb else notebook.stem
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM takes Ctrl-C's path
    nb = nbformat.read(notebook, as_version=4)
    before = emulator.find(emulator.DEFAULT_NAME)
    try:
        failure = _execute(nb, notebook.parent)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        return 130
    finally:
        _teardown(before.head_pid if before else None)
        args.out.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, args.out / f"{stem}.ipynb")
        export_html(nb, args.out / f"{stem}.html")
        print(f"wrote {args.out / stem}.ipynb and {stem}.html", flush=True)
    try:
        result = read_result(nb) if failure is None else {}
        missing = [k for k in RESULT_KEYS if k not in result]
        failure = failure or (f"cell tagged {RESULT_TAG!r} lacks {missing}" if missing else None)
    except LookupError as exc:
        failure = str(exc)
    if failure is not None:
        print(f"FAILED: {failure}", flush=True)
        return 1
    result["wall_s"] = round(time.monotonic() - start, 1)
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
