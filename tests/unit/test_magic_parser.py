"""The %raytpu argument parser: every subcommand has --help, bad arguments raise UsageError."""

from __future__ import annotations

import pytest
from IPython.core.error import UsageError

from raytpu_lab.magics import _HelpShown, build_parser

COMMANDS = ["up", "down", "connect", "status", "map", "reserve", "release", "reservations", "jax",
            "run", "attach"]


@pytest.mark.parametrize("command", COMMANDS)
def test_every_subcommand_has_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(_HelpShown):
        build_parser().parse_args([command, "--help"])
    assert f"raytpu {command}" in capsys.readouterr().out


def test_reserve_arguments() -> None:
    args = build_parser().parse_args(["reserve", "4x4", "--version", "v6e", "--slices", "2",
                                      "--name", "r", "--timeout", "5", "--detached"])
    assert (args.topology, args.version, args.slices, args.name, args.timeout, args.detached) == (
        "4x4", "v6e", 2, "r", 5.0, True)


@pytest.mark.parametrize("argv", [["bogus"], ["reserve", "4x4"], ["up", "--slices", "two"],
                                  ["jax", "--slices", "two"], ["run"], ["attach"]])
def test_bad_arguments_raise_usage_error(argv: list[str]) -> None:
    with pytest.raises(UsageError):
        build_parser().parse_args(argv)


def test_reservation_arguments() -> None:
    parser = build_parser()
    assert parser.parse_args(["run", "--on", "r1"]).on == "r1"
    assert parser.parse_args(["attach", "r1"]).name == "r1"
    assert parser.parse_args(["reservations", "--all"]).all
    args = parser.parse_args(["jax", "--reservation", "r1"])
    assert (args.reservation, args.topology, args.version) == ("r1", None, None)
