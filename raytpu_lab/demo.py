"""Run the quickstart notebook headless on the emulated TPU cluster and report what it measured.

``python -m raytpu_lab.demo`` (what ``make demo`` runs) executes ``notebooks/01_quickstart.ipynb`` with
nbclient, writes ``build/quickstart.ipynb`` (executed) and ``build/quickstart.html`` (static: the SVG
topology and plotly.js are inline, so it renders offline), always stops the emulated cluster the
notebook started, and prints as its last line ``RESULT {json}``: the dict from the cell tagged
``demo-result`` plus ``wall_s``. Exit status: 0 success, 1 failed cell or no result, 130 interrupted.
"""

from __future__ import annotations

import argparse
import ast
import json
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
from jupyter_core.utils import run_sync
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError
from nbconvert import HTMLExporter
from traitlets import default

from raytpu_lab.cluster import emulator

__all__ = ["main", "read_result", "export_html", "RESULT_TAG", "RESULT_KEYS"]

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULT_TAG = "demo-result"
RESULT_KEYS = ("slice", "hosts", "devices", "loss_first", "loss_last", "steps_per_s")
CELL_TIMEOUT_S = 600

# The lab template pulls require.js, MathJax and mermaid from a CDN (and the widget manager from
# unpkg when widget state is saved). Offline they fail; online require.js makes plotly.js's inline
# UMD bundle register as an anonymous AMD module so ``window.Plotly`` is never set and the chart
# stays blank. Dropping those blocks leaves a page with no external script at all. It also shows
# image/svg+xml as an <img> data URI (its ``skip_svg_encoding`` runs bleach, which escapes <svg>):
# we inline the SVG itself so its <title> tooltips and element ids work in the page.
_OFFLINE_TEMPLATE = """{%- extends 'lab/index.html.j2' -%}
{%- block html_head_js_requirejs -%}{%- endblock html_head_js_requirejs -%}
{%- block jupyter_widgets -%}{%- endblock jupyter_widgets -%}
{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
{%- block data_svg -%}
<div class="jp-RenderedSVG jp-OutputArea-output {{ extra_class }}" data-mime-type="image/svg+xml">
{{ output.data['image/svg+xml'] }}
</div>
{%- endblock data_svg -%}
"""


class _VenvKernelManager(AsyncKernelManager):  # type: ignore[misc]
    """Kernel ``python3`` that always runs in this interpreter (``sys.executable``).

    With no kernelspec directories to search, ``python3`` resolves to ipykernel's built-in spec, whose
    argv starts with ``sys.executable``; a ``python3`` kernelspec in ``~/.local/share/jupyter`` or
    ``/usr/share/jupyter`` (possibly another Python without raytpu_lab) can't shadow it, and nothing is
    installed anywhere.
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
            text = data.get("text/plain") or (out.get("text") if out.get("name") == "stdout" else "")
            for chunk in [text, *reversed(text.splitlines())] if text else []:
                for parse in (json.loads, ast.literal_eval):
                    try:
                        value = parse(chunk.strip())
                    except (ValueError, SyntaxError):
                        continue
                    if isinstance(value, dict):
                        return value
    raise LookupError(f"no code cell tagged {RESULT_TAG!r} shows a dict")


def export_html(nb: nbformat.NotebookNode, path: Path) -> None:
    """Write ``nb`` as a self-contained JupyterLab-styled HTML page (no CDN scripts)."""
    exporter = HTMLExporter(
        template_name="lab",
        template_file="raytpu_offline.html.j2",
        extra_loaders=[DictLoader({"raytpu_offline.html.j2": _OFFLINE_TEMPLATE})],
    )
    body, _ = exporter.from_notebook_node(nb)
    path.write_text(body, encoding="utf-8")


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM takes the same path as Ctrl-C: tear down, exit 130


def _shutdown_kernel(client: NotebookClient) -> None:
    km = client.km  # nbclient stops its kernel itself, except when interrupted mid-cell
    if km is not None and km.has_kernel:
        run_sync(km.shutdown_kernel)(now=True)


def _teardown(pid_before: int | None) -> None:
    cluster = emulator.find(emulator.DEFAULT_NAME)
    if cluster is None:
        return
    if cluster.head_pid == pid_before:
        print(f"emulated cluster {cluster.name!r} was up before the demo: left running", flush=True)
        return
    cluster.down()
    print(f"stopped emulated cluster {cluster.name!r}", flush=True)


def main(argv: list[str] | None = None) -> int:
    """Execute the notebook, export it, tear down, print ``RESULT {json}``; return the exit status."""
    start = time.monotonic()
    parser = argparse.ArgumentParser(prog="python -m raytpu_lab.demo", description=__doc__.split("\n")[0])
    default_nb = REPO_ROOT / "notebooks" / "01_quickstart.ipynb"
    parser.add_argument("--notebook", type=Path, default=default_nb, help="notebook to run")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "build", help="output folder")
    args = parser.parse_args(argv)
    notebook: Path = args.notebook.resolve()
    stem = "quickstart" if notebook == default_nb else notebook.stem
    signal.signal(signal.SIGTERM, _interrupt)

    nb = nbformat.read(notebook, as_version=4)
    code = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    current: dict[str, int] = {"index": -1}

    def on_start(cell: nbformat.NotebookNode, cell_index: int) -> None:
        current["index"] = cell_index
        if cell_index in code:
            head = (cell.source.strip().splitlines() or [""])[0][:80]
            print(f"[{code.index(cell_index) + 1}/{len(code)}] {head}", flush=True)

    client = NotebookClient(
        nb, timeout=CELL_TIMEOUT_S, kernel_name="python3", kernel_manager_class=_VenvKernelManager,
        resources={"metadata": {"path": str(notebook.parent)}}, on_cell_start=on_start,
    )
    before = emulator.find(emulator.DEFAULT_NAME)
    failure: str | None = None
    try:
        client.execute()
    except (CellExecutionError, CellTimeoutError, DeadKernelError) as exc:
        i = current["index"]
        head = (nb.cells[i].source.strip().splitlines() or [""])[0][:80] if i >= 0 else ""
        why = f"{exc.ename}: {exc.evalue}" if isinstance(exc, CellExecutionError) else str(exc)
        failure = f"cell {i + 1}/{len(nb.cells)} failed ({head}): {(why.strip().splitlines() or [''])[0][:300]}"
    except KeyboardInterrupt:
        print("interrupted: tearing down", flush=True)
        return 130
    finally:
        try:
            _shutdown_kernel(client)
        finally:
            _teardown(before.head_pid if before else None)
            args.out.mkdir(parents=True, exist_ok=True)
            nbformat.write(nb, args.out / f"{stem}.ipynb")
            export_html(nb, args.out / f"{stem}.html")
            print(f"wrote {args.out / stem}.ipynb and .html", flush=True)
    if failure is None:
        try:
            result = read_result(nb)
            missing = [k for k in RESULT_KEYS if k not in result]
            if missing:
                failure = f"cell tagged {RESULT_TAG!r} lacks keys {missing}"
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
