"""The input transformers of raytpu_lab.magics.awaiting: a training cell becomes an awaited one
(so the kernel keeps serving the dashboard's Stop button), an empty %%raytpu cell a line magic."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from IPython.core.async_helpers import _asyncio_runner

from raytpu_lab.magics import awaiting


@pytest.fixture()
def shell(monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    fake = SimpleNamespace(autoawait=True, loop_runner=_asyncio_runner)
    monkeypatch.setattr(awaiting, "_current_shell", lambda: fake)
    return fake


def test_a_training_cell_is_awaited_with_its_body_intact(shell: SimpleNamespace) -> None:
    lines = ["%%raytpu jax --topology 4x4 --version v6e\n", "def f(config):\n", "    pass\n"]
    out = awaiting.await_run_cells(lines)
    assert len(out) == 1 and out[0].startswith("await get_ipython().run_cell_magic('raytpu', ")
    namespace: dict[str, object] = {}
    calls: list[tuple[str, str, str]] = []

    async def run_cell_magic(name: str, line: str, body: str) -> None:
        calls.append((name, line, body))

    namespace["get_ipython"] = lambda: SimpleNamespace(run_cell_magic=run_cell_magic)
    import asyncio

    exec(compile("async def _cell():\n    " + out[0], "<cell>", "exec"), namespace)
    asyncio.run(namespace["_cell"]())  # type: ignore[operator]
    assert calls == [("raytpu", "--await jax --topology 4x4 --version v6e",
                      "def f(config):\n    pass\n")]


@pytest.mark.parametrize("first", [
    "%%raytpu jax --background --topology 4x4 --version v6e\n",  # returns at once: no await
    "%%raytpu jax --help\n",
    "%%raytpu run --on r1\n",  # per-host cells block on their own
    "%%time\n",
])
def test_other_cells_are_left_alone(shell: SimpleNamespace, first: str) -> None:
    lines = [first, "x = 1\n"]
    assert awaiting.await_run_cells(lines) == lines


def test_without_an_asyncio_loop_the_cell_blocks_as_written(shell: SimpleNamespace) -> None:
    shell.loop_runner = object()  # e.g. trio, or autoawait off below
    lines = ["%%raytpu torch --topology 2x2x2 --version v5p\n", "def f(config):\n    pass\n"]
    assert awaiting.await_run_cells(lines) == lines
    shell.loop_runner, shell.autoawait = _asyncio_runner, False
    assert awaiting.await_run_cells(lines) == lines


def test_an_empty_cell_magic_runs_as_the_line_magic() -> None:
    assert awaiting.empty_cells_as_lines(["%%raytpu run --help\n"]) == [
        "get_ipython().run_line_magic('raytpu', 'run --help')\n"]
    assert awaiting.empty_cells_as_lines(["%%raytpu2 x\n"]) == ["%%raytpu2 x\n"]
    assert awaiting.empty_cells_as_lines(["%%raytpu run --on r1\n", "x\n"]) == [
        "%%raytpu run --on r1\n", "x\n"]
