"""The %raytpu argument parser: every subcommand has --help, bad arguments raise UsageError."""

from __future__ import annotations

import pytest
from IPython.core.error import UsageError

from raytpu_lab.magics.parser import HelpShown, build_parser

COMMANDS = ["up", "down", "connect", "status", "map", "reserve", "release", "reservations", "jax",
            "run", "attach", "torch", "check"]


@pytest.mark.parametrize("command", COMMANDS)
def test_every_subcommand_has_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(HelpShown):
        build_parser().parse_args([command, "--help"])
    assert f"raytpu {command}" in capsys.readouterr().out


def test_reserve_arguments() -> None:
    args = build_parser().parse_args(["reserve", "4x4", "--version", "v6e", "--slices", "2",
                                      "--name", "r", "--timeout", "5", "--detached"])
    assert (args.topology, args.version, args.slices, args.name, args.timeout, args.detached) == (
        "4x4", "v6e", 2, "r", 5.0, True)


@pytest.mark.parametrize("argv", [["bogus"], ["reserve", "4x4"], ["up", "--slices", "two"],
                                  ["jax", "--slices", "two"], ["run"], ["attach"],
                                  ["torch", "--topology", "2x2x2", "--version", "v5p",
                                   "--backend", "nccl"]])
def test_bad_arguments_raise_usage_error(argv: list[str]) -> None:
    with pytest.raises(UsageError):
        build_parser().parse_args(argv)


def test_jax_cells_become_awaited_so_the_kernel_keeps_serving_widgets() -> None:
    from IPython import get_ipython
    from IPython.testing.globalipapp import start_ipython

    ip = start_ipython() or get_ipython()  # None when another test started it already
    ip.run_line_magic("load_ext", "raytpu_lab")
    cell = "%%raytpu jax --topology 4x4 --version v6e --name 'a b'\ndef f(config):\n    pass\n"
    code = ip.transform_cell(cell)
    assert code.startswith("await get_ipython().run_cell_magic('raytpu', \"--await jax")
    assert ip.should_run_async(cell, transformed_cell=code)
    assert "def f(config):" in eval(code.split(", ", 2)[2].rsplit(")", 1)[0])  # noqa: S307
    for untouched in ("%%raytpu jax --background --topology 4x4 --version v6e\npass\n",
                      "%%raytpu jax --help\n", "%raytpu status\n", "print(1)\n"):
        assert not ip.transform_cell(untouched).startswith("await"), untouched
    ip.autoawait = False
    try:
        assert not ip.transform_cell(cell).startswith("await")
    finally:
        ip.autoawait = True


def test_reservation_arguments() -> None:
    parser = build_parser()
    assert parser.parse_args(["run", "--on", "r1"]).on == "r1"
    assert parser.parse_args(["attach", "r1"]).name == "r1"
    assert parser.parse_args(["reservations", "--all"]).all
    args = parser.parse_args(["jax", "--reservation", "r1"])
    assert (args.reservation, args.topology, args.version) == ("r1", None, None)


def test_torch_arguments() -> None:
    args = build_parser().parse_args(["torch", "--topology", "2x2x2", "--version", "v5p",
                                      "--backend", "tpu_dist", "--chips-per-worker", "2"])
    assert (args.topology, args.version, args.slices, args.backend, args.chips_per_worker,
            args.out) == ("2x2x2", "v5p", 1, "tpu_dist", 2, "last_run")


@pytest.mark.parametrize("argv, needle", [
    (["reserve", "2x2x2", "--versoin", "v4"], "unrecognized arguments: --versoin"),
    (["reserve", "2x2x2", "--version", "v4", "--slice", "2"], "unrecognized arguments: --slice 2"),
])
def test_typos_in_options_are_named_not_guessed(argv: list[str], needle: str) -> None:
    from IPython.core.error import UsageError

    with pytest.raises(UsageError, match=needle):
        build_parser().parse_args(argv)


def test_map_interval_must_be_positive() -> None:
    from IPython.core.error import UsageError

    with pytest.raises(UsageError, match="--interval: 0 s: it must be a finite number above 0"):
        build_parser().parse_args(["map", "--interval", "0"])
    assert build_parser().parse_args(["map", "--interval", "0.5"]).interval == 0.5


def test_an_expression_option_keeps_its_spaces() -> None:
    import shlex

    from raytpu_lab.magics.parser import join_expressions

    def split(line: str) -> list[str]:
        return join_expressions(shlex.split(line))

    assert split("serve --on s1 --config dict(w=w, b=b) --app m") == [
        "serve", "--on", "s1", "--config", "dict(w=w, b=b)", "--app", "m"]
    assert split("jax --config=dict(steps=10, lr=0.1)") == ["jax", "--config=dict(steps=10, lr=0.1)"]
    assert split("""jax --config "{'steps': 100}" --slices 2""") == [
        "jax", "--config", "{'steps': 100}", "--slices", "2"]
    assert split("serve --config") == ["serve", "--config"]  # argparse says it needs a value
    assert split("reserve 2x2x2 --version v4") == ["reserve", "2x2x2", "--version", "v4"]
    args = build_parser().parse_args(split("serve --on s1 --config dict(w=w, b=b)"))
    assert args.config == "dict(w=w, b=b)" and args.on == "s1"


def test_serve_config_that_is_not_a_dict_of_kwargs_is_one_clear_error() -> None:
    from raytpu_lab.errors import ServeError
    from raytpu_lab.magics.serve_commands import _init_kwargs

    assert _init_kwargs("dict(w=w, b=2)", {"w": 3}) == {"w": 3, "b": 2}
    assert _init_kwargs(None, {}) is None
    with pytest.raises(ServeError, match="could not be evaluated: NameError") as info:
        _init_kwargs("dict(w=nope)", {})
    assert "dict(w=w, b=b)" in str(info.value)
    with pytest.raises(ServeError, match="is a list, not a dict"):
        _init_kwargs("[1, 2]", {})
