"""``%%raytpu run --on`` parses the cell here first: a syntax error is shown briefly, and nothing
(no host actor, no jax.distributed) is started. No cluster is needed to see it."""

from __future__ import annotations

import pytest
from IPython.testing.globalipapp import start_ipython
from IPython.utils.capture import capture_output

from raytpu_lab.lab import Session, use_session
from raytpu_lab.reservations.spmd import check_cell


@pytest.fixture()
def ip(monkeypatch: pytest.MonkeyPatch):
    from IPython import get_ipython

    shell = start_ipython() or get_ipython()  # None when another test started it already
    shell.run_line_magic("load_ext", "raytpu_lab")
    with use_session(Session()) as session:
        shell.session = session  # the session the magics use, for the test to reach its services
        yield shell


def test_a_syntax_error_is_shown_where_it_is_and_nothing_is_sent(ip, monkeypatch) -> None:
    started: list[str] = []
    monkeypatch.setattr(ip.session.hosts, "slice_session", lambda name: started.append(name))
    with capture_output() as out:
        result = ip.run_cell("%%raytpu run --on r1\nimport jax\nx = (1,\n", store_history=False)
    text = out.stdout + out.stderr
    assert result.error_in_exec is not None
    assert "SyntaxError in the cell, line 2: " in text, text
    assert "Nothing was sent to the hosts of 'r1'." in text
    assert "Traceback" not in text and "raytpu_lab/" not in text
    assert started == []


def test_check_cell_accepts_what_the_hosts_run() -> None:
    check_cell("import jax\njax.device_count()\n")
    with pytest.raises(SyntaxError):
        check_cell("def f(:\n    pass\n")


def test_a_host_traceback_starts_in_the_cell_and_shows_its_lines() -> None:
    from raytpu_lab.reservations.spmd import _HostProcess  # the host side, run here without Ray

    host = _HostProcess(rank=0)
    out = host.run("def f(x):\n    return 1 / x\n\nf(0)\n")
    error = out["error"]
    assert error.startswith("Traceback (most recent call last):\n  File \"<cell>\", line 4"), error
    assert "return 1 / x" in error and error.rstrip().endswith("ZeroDivisionError: division by zero")
    assert "spmd.py" not in error


def test_a_called_function_traceback_starts_in_the_function() -> None:
    from raytpu_lab.reservations.spmd import _HostProcess

    def boom() -> None:
        raise ValueError("bad shard")

    error = _HostProcess(rank=0).run(None, boom)["error"]
    assert "spmd.py" not in error and "in boom" in error and "ValueError: bad shard" in error


@pytest.mark.parametrize("extra, needle, ok", [
    ("--topology 4x4", "drop --topology 4x4 (the reservation's is 2x2x2)", False),
    ("--version v6e", "drop --version v6e (the reservation's is v4)", False),
    ("--topology 2x2x2 --version v4", "", True),
])
def test_jax_on_a_reservation_refuses_a_different_shape(ip, monkeypatch, extra, needle, ok) -> None:
    from types import SimpleNamespace

    from raytpu_lab.tpu.topology import SliceShape

    held = SimpleNamespace(name="r1", shape=SliceShape.of("v4", "2x2x2"), slice_names=["s0"])
    monkeypatch.setitem(ip.session.reservation_service.held, "r1", held)
    launched: list[str] = []
    monkeypatch.setattr(ip.session.runs, "start", lambda spec, **kw: launched.append(spec.topology))
    with capture_output() as out:
        ip.run_cell(f"%%raytpu jax --reservation r1 {extra}\ndef f(config):\n    pass\n",
                    store_history=False)
    text = out.stdout + out.stderr
    if ok:
        assert launched == ["2x2x2"], text
    else:
        assert needle in text and launched == [], text
