"""The %raytpu argument parser: every subcommand has --help, bad arguments raise UsageError."""

from __future__ import annotations

import pytest
from IPython.core.error import UsageError

from raytpu_lab.magics import _HelpShown, build_parser

COMMANDS = ["up", "down", "connect", "status", "map", "reserve", "release", "reservations", "jax",
            "torch"]


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
                                  ["jax", "--topology", "4x4"], ["torch", "--topology", "2x2x2"],
                                  ["torch", "--topology", "2x2x2", "--version", "v5p",
                                   "--backend", "nccl"]])
def test_bad_arguments_raise_usage_error(argv: list[str]) -> None:
    with pytest.raises(UsageError):
        build_parser().parse_args(argv)


def test_torch_arguments() -> None:
    args = build_parser().parse_args(["torch", "--topology", "2x2x2", "--version", "v5p",
                                      "--backend", "tpu_dist", "--chips-per-worker", "2"])
    assert (args.topology, args.version, args.slices, args.backend, args.chips_per_worker,
            args.out) == ("2x2x2", "v5p", 1, "tpu_dist", 2, "last_run")
