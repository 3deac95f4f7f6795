"""One error, three spellings: Python (str(err)), a cell (brief.py), the shell (cli.py)."""

from __future__ import annotations

import argparse

import pytest

from raytpu_lab import cli
from raytpu_lab.advice import OPTIONS, cmd, opt, spell
from raytpu_lab.errors import RaytpuError, ReservationError
from raytpu_lab.magics.brief import brief_errors
from raytpu_lab.reservations.service import no_reservation_error


def test_no_reservation_is_spelled_per_front_end() -> None:
    err = no_reservation_error("r9", ["r1"])
    py = str(err)
    assert "lab.reserve(...)" in py and "lab.attach('NAME')" in py
    assert "lab.cluster_reservations()" in py and "%raytpu" not in py
    cell = err.spelled("cell")
    assert "%raytpu reserve ..." in cell and "%raytpu attach NAME" in cell
    assert "%raytpu reservations --all" in cell
    shell = err.spelled("shell")
    assert "in a notebook: %raytpu attach NAME" in shell
    assert str(err) == py  # spelled() changes nothing


def test_the_same_option_is_spelled_three_ways() -> None:
    err = RaytpuError((opt("slices", 0), " is not allowed."), fix=("Pass a positive ", opt("timeout"), "."))
    assert str(err) == "slices=0 is not allowed.\nWhat to do: Pass a positive timeout_s=."
    assert err.spelled("cell") == "--slices 0 is not allowed.\nWhat to do: Pass a positive --timeout."
    assert err.spelled("shell") == err.spelled("cell")


def test_shell_commands_use_the_shell_and_the_rest_say_notebook() -> None:
    text = ("Stop it (", cmd("down", name="x"), ") or release ", cmd("release", "r1"), ".")
    assert spell(text) == "Stop it (lab.down(name='x')) or release lab.release('r1')."
    assert spell(text, "cell") == "Stop it (%raytpu down --name x) or release %raytpu release r1."
    assert spell(text, "shell") == ("Stop it (raytpu down --name x) or release "
                                    "in a notebook: %raytpu release r1.")


@pytest.mark.parametrize(("part", "python", "cell"), [
    (opt("yes", True), "yes=True", "--yes"),
    (opt("profile", "5:8"), "profile='5:8'", "--profile 5:8"),
    (opt("config", {"steps": 100}), "config={'steps': 100}", "--config \"{'steps': 100}\""),
    (opt("cluster", "NAME"), "name='NAME'", "--cluster NAME"),
    (opt("wait"), "wait_s=", "wait_s= (a Python argument; a cell has no option for it)"),
    (cmd("up", tpu="v6e:4x4", slices=2), "lab.up(tpu='v6e:4x4', slices=2)",
     "%raytpu up --tpu v6e:4x4 --slices 2"),
    (cmd("connect-kuberay", "rc", namespace="ns", address="ray://127.0.0.1:10001"),
     "lab.connect_kuberay('rc', namespace='ns', address='ray://127.0.0.1:10001')",
     "%raytpu connect --kuberay rc --namespace ns ray://127.0.0.1:10001"),
])
def test_parts_spelled_for_python_and_a_cell(part: object, python: str, cell: str) -> None:
    assert spell([part]) == python  # type: ignore[list-item]
    assert spell([part], "cell") == cell  # type: ignore[list-item]


def test_every_cell_flag_exists_in_a_parser() -> None:
    from raytpu_lab.magics.parser import build_parser
    flags: set[str] = set()
    parsers = [build_parser()]
    while parsers:
        p = parsers.pop()
        for action in p._actions:
            flags.update(action.option_strings)
            if isinstance(action, argparse._SubParsersAction):
                parsers.extend(action.choices.values())
    missing = {f for f, _ in OPTIONS.values() if f and f not in flags}
    assert missing == set()


def test_unknown_names_are_refused() -> None:
    with pytest.raises(KeyError):
        opt("timeout_s")
    with pytest.raises(KeyError):
        cmd("stop")


def test_a_cell_shows_the_cell_spelling() -> None:
    args = argparse.Namespace(command="release", debug=False)
    with pytest.raises(ReservationError) as raised:
        brief_errors(args, no_reservation_error("r9", []))
    assert "%raytpu attach NAME" in raised.value.fix
    assert "%raytpu attach NAME" in "\n".join(raised.value._render_traceback_())


def test_the_shell_prints_the_shell_spelling(monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    def fail(args: argparse.Namespace) -> int:
        raise RaytpuError("x", fix=("Run ", cmd("down", name="a"), " or ", cmd("status"), "."))
    monkeypatch.setitem(cli._COMMANDS, "list", fail)
    assert cli.main(["list"]) == 1
    assert "Run raytpu down --name a or raytpu status." in capsys.readouterr().err


def test_assigned_text_survives_respelling() -> None:
    err = RaytpuError("x", fix=("Stop it: ", cmd("down")))
    err.fix += " Logs are kept."
    assert err.respell("cell").fix == "Stop it: lab.down() Logs are kept."
    assert str(err).endswith("Logs are kept.")
