"""Refusals that need no cluster come before anything else: no display, no cell run, no Ray.

Each bad request runs as a user types it, in an IPython shell whose Lab has no cluster. If any
step that needs a cluster (or shows a dashboard, or runs the cell) came before the check, the
spies below would see it, or the error would be "no Ray cluster is connected" instead.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from IPython import get_ipython
from IPython.testing.globalipapp import start_ipython
from IPython.utils.capture import capture_output

import raytpu_lab.magics.run_commands as magics_module
import raytpu_lab.session.connection as connection_module
from raytpu_lab.lab import Lab, use_session
from raytpu_lab.train.service import Runs

BODY = "ran_the_cell = True\ndef f(config):\n    pass\n"


@pytest.fixture(scope="module")
def ip():
    shell = start_ipython() or get_ipython()  # None when another test started it already
    shell.run_line_magic("load_ext", "raytpu_lab")
    return shell


@pytest.fixture()
def contacted(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """A fresh Lab as the kernel's; records every step that needs a cluster or shows a view."""
    seen: list[str] = []
    lab = Lab()

    def spy(name: str, real):
        def call(*args, **kwargs):
            seen.append(name)
            return real(*args, **kwargs)
        return call

    for name in ("require", "snapshot", "raw", "reservations"):  # every read of the cluster
        monkeypatch.setattr(lab.reader, name, spy(name, getattr(lab.reader, name)))
    for name in ("start", "_wait_for_idle"):  # the run service: launching anything
        monkeypatch.setattr(Runs, name, spy(name, getattr(Runs, name)))
    for name in ("probe", "connect", "default_address"):  # reaching for a cluster
        monkeypatch.setattr(connection_module, name, spy(name, getattr(connection_module, name)))
    monkeypatch.setattr(magics_module, "RunDashboard", spy("dashboard", magics_module.RunDashboard))
    import ray

    for name in ("init", "nodes", "get"):
        monkeypatch.setattr(ray, name, spy(f"ray.{name}", getattr(ray, name)))
    with use_session(lab):
        yield seen


def _run(ip, source: str):
    ip.user_ns.pop("ran_the_cell", None)
    with capture_output() as out:
        result = ip.run_cell(source, store_history=False)
    return out, result


@pytest.mark.parametrize(("line", "body", "needle"), [
    ("jax --topology 2x2x2 --version v4 --profile 8:5", BODY, "Profile window 8:5"),
    ("jax --topology 2x2x2 --version v4 --profile x", BODY, "is not START:STOP"),
    ("jax --topology 4x5 --version v6e", BODY, "Use the nearest valid shape: --topology 4x4 "
                                                "--version v6e"),
    ("jax --topology 2x2x2 --version v9", BODY, "Unknown TPU generation 'v9'"),
    ("jax --topology 2x2x2 --version v4 --slices 0", BODY, "--slices 0 is not allowed"),
    ("jax --topology 2x2x2 --version v4 --config '[1, 2]'", BODY, "not a dict"),
    ("jax --topology 2x2x2 --version v4 --config '{'", BODY, "could not be evaluated"),
    ("jax --topology 2x2x2 --version v4", "def f(a, b):\n    pass\n", "f(a, b) cannot be"),
    ("jax --topology 2x2x2 --version v4", "x = 1\n", "defines no function"),
    ("jax --topology 2x2x2 --version v4", "def f(config):\n    pass\n  oops\n", "syntax error"),
    ("jax --reservation ghost", BODY, "No reservation named 'ghost'"),
    ("jax --topology 2x2x2 --version v4", "def f(config):\n    print(stpe)\n",
     "f uses stpe, which is not defined (line 2): it would fail with NameError on every worker"),
    ("torch --topology 2x2x2 --version v5p", "def f(config):\n    print(stpe)\n",
     "f uses stpe, which is not defined"),
    ("jax --topology 2x2x2 --version v4", "async def f(config):\n    pass\n",
     "f is an async function"),
    ("jax --topology 2x2x2 --version v4", "raise ValueError('top of the cell')\n",
     "The cell raised ValueError: top of the cell (line 1)"),
    ("torch --topology 2x2x2 --version v5p --chips-per-worker 3", BODY, "chips"),
    ("torch --topology 4x5 --version v6e", BODY, "--topology 4x4 --version v6e"),
    ("torch --topology 2x2x2", BODY, "raytpu torch: --topology and --version are required"),
    ("torch --reservation ghost", BODY, "No reservation named 'ghost'"),
    ("torch --topology 2x2x2 --version v5p --profile 3:1", BODY, "Profile window 3:1"),
])
def test_a_bad_training_cell_is_refused_before_anything(ip, contacted: list[str], line: str,
                                                        body: str, needle: str) -> None:
    out, result = _run(ip, f"%%raytpu {line}\n{body}")
    text = out.stdout + out.stderr
    assert result.error_in_exec is not None, text
    assert needle in text, text
    assert "no Ray cluster is connected" not in text
    assert contacted == [], contacted  # no connection check, no Ray call, no dashboard
    assert not out.outputs, out.outputs  # nothing displayed
    assert "raytpu_lab/" not in text, text  # one short block, no traceback


def test_the_shape_is_checked_before_the_cell_runs(ip, contacted: list[str]) -> None:
    out, result = _run(ip, f"%%raytpu jax --topology 4x5 --version v6e --profile 5:8\n{BODY}")
    assert result.error_in_exec is not None
    assert "ran_the_cell" not in ip.user_ns  # the cell's code never ran
    out, result = _run(ip, f"%%raytpu jax --topology 2x2x2 --version v4 --profile 8:5\n{BODY}")
    assert "ran_the_cell" not in ip.user_ns


@pytest.mark.parametrize(("line", "needle"), [
    ("reserve 4x5 --version v6e", "Use the nearest valid shape: reserve 4x4 --version v6e (or 2x8, 4x8)"),
    ("reserve 2x2x3 --version v4", "reserve 2x2x4 --version v4"),
    ("reserve 2x2x2 --version v4 --timeout 0", "--timeout 0.0 is not allowed"),
    ("reserve 2x2x2 --version v4 --slices 0", "--slices 0 is not allowed"),
    ("up --tpu v6e:4x5", "Use the nearest valid shape: --tpu v6e:4x4 (or 2x8, 4x8)"),
    ("up --tpu v6e-4x4", "Cannot read TPU spec"),
    ("reserve 2x2x2 --version v4 --timeout nan", "--timeout nan is not allowed"),
    ("reserve 2x2x2 --version v4 --timeout inf", "--timeout inf is not allowed"),
    ("connect --timeout 0", "--timeout 0.0 is not allowed"),
    ("map --interval inf", "it must be a finite number above 0"),
    ("reserve '2x2x2 --version v4", "cannot split the line into arguments: No closing quotation"),
])
def test_a_bad_line_is_refused_before_anything(ip, contacted: list[str], line: str,
                                               needle: str) -> None:
    out, result = _run(ip, f"%raytpu {line}")
    text = out.stdout + out.stderr
    assert result.error_in_exec is not None, text
    assert needle in text, text
    assert contacted == [], contacted
    assert "raytpu_lab/" not in text, text


@pytest.mark.parametrize("command", ["run", "jax", "torch"])
def test_cell_help_works_with_an_empty_body(ip, command: str) -> None:
    out, result = _run(ip, f"%%raytpu {command} --help\n")
    assert result.error_in_exec is None and result.error_before_exec is None, out.stdout
    assert f"usage: raytpu {command}" in out.stdout
    assert "cell body is empty" not in out.stdout + out.stderr


@pytest.mark.parametrize("command", ["run --on r1", "jax --topology 2x2x2 --version v4"])
def test_a_cell_subcommand_without_its_cell_says_what_the_cell_holds(ip, contacted: list[str],
                                                                    command: str) -> None:
    out, result = _run(ip, f"%%raytpu {command}\n\n")
    text = out.stdout + out.stderr
    assert result.error_in_exec is not None
    assert "is a cell magic: put the" in text and "--help" in text, text
    assert contacted == []


@pytest.mark.parametrize(("source", "needle"), [
    ("%%raytpu run --on r1 --bogus\nx = 1\n",
     "raytpu run: unrecognized arguments: --bogus\n(see %%raytpu run --help)"),
    ("%raytpu reserve 2x2x2 --version v4 --bogus 3",
     "raytpu reserve: unrecognized arguments: --bogus 3\n(see %raytpu reserve --help)"),
    ("%%raytpu jax --topology 2x2x2 --version v4 --stpes 3\ndef f(config):\n    pass\n",
     "raytpu jax: unrecognized arguments: --stpes 3\n(see %%raytpu jax --help)"),
    ("%raytpu reserve 2x2x2",
     "raytpu reserve: the following arguments are required: --version\n"
     "(see %raytpu reserve --help)"),
])
def test_usage_errors_name_the_subcommand_and_its_help(ip, contacted: list[str], source: str,
                                                       needle: str) -> None:
    out, result = _run(ip, source)
    assert result.error_in_exec is not None
    assert needle in out.stdout + out.stderr, out.stdout + out.stderr
    assert contacted == []
