"""The "Ray TPU" sidebar in a real JupyterLab (headless Debian chromium, issue 15).

The sidebar shows the test session's shared emulated cluster (its slices, no kernel needed); a
reservation made in a notebook appears in its list within 2 s; its Release button frees it (checked
through Ray from the kernel); dragging its row, or a free slice's, into the notebook inserts the
matching cell; the map fills its box in the 240 px sidebar and in the main area, where it
survives a page reload (JupyterLab's layout restorer). Screenshots: ``build/sidebar.png``,
``build/sidebar_drop.png``, ``build/sidebar_map_reload.png``, ``build/sidebar_run.png``.
"""

from __future__ import annotations

import contextlib
import re
import time
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Locator, Page

from tests.browser.conftest import LabServer, jupyterlab_page

pytestmark = [pytest.mark.browser, pytest.mark.timeout(420)]

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "build"
NOTEBOOK = "sidebar.ipynb"
APPEARS_WITHIN_S = 2.0
SLICES = 2  # at least: the notebooks' `up` asks the shared cluster for 2 x v4 2x2x2
CLUSTER_ID = "emulated-raytpu"  # the shared cluster's id in the sidebar's picker (jupyter/clusters.py)
UP_CELL = "%load_ext raytpu_lab\n%raytpu up --tpu v4:2x2x2 --slices 2"


@pytest.fixture(scope="module")
def sb_cluster(shared_cluster: Any) -> Any:
    """The session's shared cluster (tests/conftest.py); the notebooks' ``%raytpu up`` joins it."""
    return shared_cluster


CELLS = [
    UP_CELL,
    "%raytpu reserve 2x2x2 --version v4 --name side1",
    "import ray\nprint('STATES', [g['state'] for g in ray.util.placement_group_table().values()"
    " if g['name'] == 'raytpu:side1'])",
]
UP, RESERVE, CHECK = range(len(CELLS))


def _cell(page: Page, i: int) -> Locator:
    return page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-Cell").nth(i)


def _kernel_idle(page: Page, timeout_s: float = 180) -> None:
    """The notebook toolbar's execution indicator says idle: a kernel still starting on a busy
    machine drops a Shift+Enter pressed before it is up (the cell stays ``[ ]``)."""
    indicator = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) "
                             ".jp-Notebook-ExecutionIndicator").first
    _wait("the kernel to be idle", lambda: indicator.get_attribute("data-status") == "idle",
          timeout_s, 0.2)


def _run(page: Page, i: int, timeout_s: float) -> str:
    _kernel_idle(page)
    cell = _cell(page, i)
    before = cell.locator(".jp-InputPrompt").inner_text().strip()
    cell.scroll_into_view_if_needed()
    cell.locator(".jp-InputArea-editor .cm-content").click()
    page.keyboard.press("Shift+Enter")
    deadline = time.monotonic() + timeout_s
    while True:
        now = cell.locator(".jp-InputPrompt").inner_text().strip()
        if now != before and re.fullmatch(r"\[\d+\]:", now):
            return cell.locator(".jp-OutputArea").inner_text()
        assert time.monotonic() < deadline, f"cell {i} still running: {cell.inner_text()[-1500:]}"
        time.sleep(0.1)


def _wait(what: str, fn: Any, timeout_s: float, interval_s: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = fn()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s} s (last {value!r})"
        time.sleep(interval_s)


def _sources(page: Page) -> list[str]:
    """The open notebook's cell sources, in order (CodeMirror's lines; a dropped cell's whole
    source, so ``text in _sources(page)`` is an exact match)."""
    return page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-Cell"
                        " .jp-InputArea-editor .cm-content").evaluate_all(
        "els => els.map(e => Array.from(e.querySelectorAll('.cm-line'))"
        ".map(l => l.textContent).join('\\n'))")


def _index_of(page: Page, text: str) -> int:
    return next(i for i, src in enumerate(_sources(page)) if text in src)


def _drag(page: Page, source: Locator, target: Locator) -> None:
    """A user's drag: press on ``source``, move past the 5 px threshold, drop on ``target``."""
    source.scroll_into_view_if_needed()
    s, t = source.bounding_box(), target.bounding_box()
    assert s and t, (s, t)
    x, y = s["x"] + 8, s["y"] + s["height"] / 2
    page.mouse.move(x, y)
    page.mouse.down()
    page.mouse.move(x + 20, y + 4, steps=4)
    page.mouse.move(t["x"] + t["width"] / 2, t["y"] + min(t["height"] - 10, 200), steps=12)
    page.mouse.up()


def _assert_map_fills_its_box(svg: Locator) -> None:
    """The map is drawn at the top of its box and fills it (its height follows the drawing):
    a fixed height left a 240 px sidebar's map tiny, floating in a tall empty box."""
    box = svg.bounding_box()
    drawn = svg.locator("g.viewport").bounding_box()
    assert box and drawn, (box, drawn)
    assert drawn["y"] - box["y"] < 30, (box, drawn)
    assert (box["y"] + box["height"]) - (drawn["y"] + drawn["height"]) < 40, (box, drawn)
    assert drawn["width"] > 0.6 * box["width"], (box, drawn)


def _open_sidebar(page: Page, cluster_id: str = CLUSTER_ID) -> Locator:
    """The sidebar, open, showing ``cluster_id``: other emulated clusters of the test session
    (the shared one) may run too, and the picker starts on the first it lists."""
    tab = page.locator('.jp-SideBar [data-id="raytpu-sidebar"]')
    tab.wait_for(timeout=60_000)
    sidebar = page.locator("#raytpu-sidebar")
    if not sidebar.is_visible():
        tab.click()
    sidebar.wait_for(state="visible", timeout=10_000)
    picker = sidebar.locator("select.raytpu-cluster-picker")
    picker.locator(f'option[value="{cluster_id}"]').wait_for(state="attached", timeout=30_000)
    if picker.input_value() != cluster_id:
        picker.select_option(cluster_id)
    return sidebar


def test_sidebar_shows_the_cluster_a_reservation_and_releases_it(
        lab_server: LabServer, sb_cluster: Any) -> None:
    BUILD.mkdir(exist_ok=True)
    with jupyterlab_page(lab_server, CELLS, NOTEBOOK, BUILD / "sidebar_failure.png",
                         height=1000) as (page, errors):
        page.goto(lab_server.lab_url(NOTEBOOK))
        page.locator(".jp-Notebook .jp-Cell").first.wait_for(timeout=60_000)
        sidebar = _open_sidebar(page)
        # No kernel has run anything yet: the server's poller alone shows the slices.
        rows = sidebar.locator(".raytpu-slice-row")
        slices = {h.slice_name for h in sb_cluster.hosts}
        _wait("the cluster's slices", lambda: rows.count() >= len(slices), 60, 0.2)
        names = rows.evaluate_all("els => els.map(e => e.dataset.slice)")
        assert set(names) == slices, names
        paths = sidebar.locator(".raytpu-map-host svg rect, .raytpu-map-host svg path")
        assert paths.count() > 0, "the sidebar's map drew nothing"
        assert sidebar.locator(".raytpu-map-host .slice[data-slice]").count() >= SLICES
        _assert_map_fills_its_box(sidebar.locator(".raytpu-map-host svg").first)

        _run(page, UP, 240)
        out = _run(page, RESERVE, 120)
        made = time.monotonic()
        assert "side1" in out, out
        row = sidebar.locator('.raytpu-reservation-row[data-reservation="side1"]')
        row.wait_for(timeout=int(APPEARS_WITHIN_S * 1000) + 500)
        appeared_s = time.monotonic() - made
        print(f"reservation appeared in the sidebar {appeared_s:.2f} s after its cell finished")
        assert appeared_s <= APPEARS_WITHIN_S, appeared_s
        assert row.locator("td").nth(3).inner_text() == "8"  # chips
        held = sidebar.locator('.raytpu-slice-row[data-state="reserved"]')
        _wait("its slice shown reserved", lambda: held.count() >= 1, 5)
        sidebar.locator(".raytpu-reservations").scroll_into_view_if_needed()
        page.screenshot(path=str(BUILD / "sidebar.png"))

        # Drag rows into the notebook: each drop inserts the matching cell.
        notebook = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook")
        _drag(page, row.locator("td").first, notebook)
        _wait("the attach cell dropped in", lambda: "%raytpu attach side1" in _sources(page), 10)
        free = sidebar.locator('.raytpu-slice-row[data-slice^="tpu-v4-2x2x2-"]'
                               ':not([data-state="reserved"])').first
        _drag(page, free.locator("td").first, notebook)
        _wait("the reserve cell dropped in",
              lambda: "%raytpu reserve 2x2x2 --version v4" in _sources(page), 10)
        assert len(_sources(page)) == len(CELLS) + 2, _sources(page)
        page.screenshot(path=str(BUILD / "sidebar_drop.png"))

        row.locator("button.raytpu-release").click()
        _wait("the row gone after Release", lambda: row.count() == 0, 10)
        out = _run(page, _index_of(page, "print('STATES'"), 60)
        assert "STATES ['REMOVED']" in out, out  # through Ray, from the kernel
        assert not errors, errors


def test_the_main_area_map_survives_a_reload(lab_server: LabServer, sb_cluster: Any) -> None:
    BUILD.mkdir(exist_ok=True)
    with jupyterlab_page(lab_server, ["1"], "reload.ipynb", BUILD / "sidebar_reload_failure.png",
                         height=900) as (page, errors):
        page.goto(lab_server.lab_url("reload.ipynb"))
        sidebar = _open_sidebar(page)
        _wait("slices", lambda: sidebar.locator(".raytpu-slice-row").count() >= SLICES, 60, 0.2)
        sidebar.locator("button.raytpu-open-map").click()
        main = page.locator(".jp-MainAreaWidget .raytpu-main-map")
        main.wait_for(timeout=10_000)
        _wait("the main-area map's hosts", lambda: main.locator(".slice[data-slice]").count() >= SLICES, 20)
        page.wait_for_timeout(1500)  # the layout restorer saves the workspace (debounced)
        page.goto(f"{lab_server.url}/lab?token={lab_server.token}")
        main = page.locator(".jp-MainAreaWidget .raytpu-main-map")
        # Restored as a tab; which tab of its dock area is in front is JupyterLab's layout
        # restorer's choice (the notebook may be): the user brings it forward by its tab.
        main.wait_for(state="attached", timeout=60_000)
        tab = page.locator(".lm-TabBar-tab", has_text=f"Ray TPU: {CLUSTER_ID}")
        assert tab.count() == 1
        tab.click()
        main.wait_for(timeout=10_000)
        _wait("the restored map's slices", lambda: main.locator(".slice[data-slice]").count() >= SLICES, 30)
        assert main.locator("svg rect").count() > 0
        _assert_map_fills_its_box(main.locator("svg").first)
        page.screenshot(path=str(BUILD / "sidebar_map_reload.png"))
        assert not errors, errors


FOREVER = '''%%raytpu jax --topology 2x2x2 --version v4 --name side-forever
def train(config):
    import time
    import ray.train
    step = 0
    while True:
        ray.train.report({"step": step})
        step += 1
        time.sleep(0.2)
'''


@pytest.mark.slow
def test_stop_in_the_sidebar_stops_a_run_of_a_busy_kernel(lab_server: LabServer,
                                                         sb_cluster: Any) -> None:
    BUILD.mkdir(exist_ok=True)
    cells = [UP_CELL, FOREVER]
    with jupyterlab_page(lab_server, cells, "busy.ipynb", BUILD / "sidebar_stop_failure.png",
                         height=1000) as (page, errors):
        page.goto(lab_server.lab_url("busy.ipynb"))
        page.locator(".jp-Notebook .jp-Cell").first.wait_for(timeout=60_000)
        sidebar = _open_sidebar(page)
        _run(page, 0, 240)
        cell = _cell(page, 1)
        before = cell.locator(".jp-InputPrompt").inner_text().strip()
        cell.locator(".jp-InputArea-editor .cm-content").click()
        page.keyboard.press("Shift+Enter")  # the kernel is now busy in this cell until the run ends
        row = sidebar.locator('.raytpu-run-row[data-run="side-forever"][data-state="running"]')
        try:
            row.wait_for(timeout=180_000)
            _wait("steps/s above 0", lambda: float(row.locator("td").nth(3).inner_text()) > 0,
                  60, 0.2)
        except BaseException:
            # The run must not outlive the test (a rerun would find its slice taken): an
            # interrupt stops it, as a user's would.
            with contextlib.suppress(Exception):  # the failure above is what to report
                for kernel in lab_server.api("/api/kernels"):  # type: ignore[union-attr]
                    lab_server.api(f"/api/kernels/{kernel['id']}/interrupt", method="POST")
            raise
        assert cell.locator(".jp-InputPrompt").inner_text().strip() == "[*]:"  # still busy
        page.screenshot(path=str(BUILD / "sidebar_run.png"))
        stop_clicked = time.monotonic()
        row.locator("button.raytpu-stop").click()
        ended = sidebar.locator('.raytpu-run-row[data-run="side-forever"][data-state="stopped"]')
        ended.wait_for(timeout=30_000)
        _wait("the cell to finish", lambda: cell.locator(".jp-InputPrompt").inner_text().strip()
              not in ("[*]:", before), 30, 0.2)
        print(f"run stopped {time.monotonic() - stop_clicked:.1f} s after Stop")
        assert "stopped" in cell.locator(".jp-OutputArea").inner_text().lower()
        assert not errors, errors
