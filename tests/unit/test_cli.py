"""The ``raytpu`` shell command: parsing, listing and errors (no Ray started)."""

from __future__ import annotations

from pathlib import Path

import pytest

from raytpu_lab import cli


def test_list_with_no_clusters_says_where_it_looked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("RAYTPU_EMULATOR_ROOT", str(tmp_path))
    assert cli.main(["list"]) == 0
    assert f"No emulated clusters running (state under {tmp_path})" in capsys.readouterr().out


def test_down_of_a_missing_cluster_is_not_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("RAYTPU_EMULATOR_ROOT", str(tmp_path))
    assert cli.main(["down", "--name", "nope"]) == 0
    assert "No emulated cluster named 'nope'" in capsys.readouterr().out


def test_status_without_address_or_cluster_fails_with_a_hint(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("RAYTPU_EMULATOR_ROOT", str(tmp_path))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert cli.main(["status"]) == 1
    err = capsys.readouterr().err
    assert "No Ray cluster to connect to" in err and "(raytpu up)" in err  # the shell's spelling
    assert "in a notebook: %raytpu connect --kuberay NAME" in err
    assert cli.main(["status", "--name", "nope"]) == 1
    assert "raytpu list shows the running ones" in capsys.readouterr().err


def test_an_invalid_shape_prints_what_why_fix_and_exits_1(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("RAYTPU_EMULATOR_ROOT", str(tmp_path))
    assert cli.main(["up", "--tpu", "v6e:4x5"]) == 1
    err = capsys.readouterr().err
    assert "4x5" in err and "Traceback" not in err
    assert not any(tmp_path.iterdir())  # nothing was started


def test_a_command_is_required() -> None:
    with pytest.raises(SystemExit):
        cli.main([])


def test_a_bad_manifest_is_refused_before_anything_starts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("RAYTPU_EMULATOR_ROOT", str(tmp_path / "emu"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: ray.io/v1\nkind: RayCluster\nmetadata: {name: x}\nspec: {}\n")
    assert cli.main(["up", "--manifest", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "bad.yaml" in err and "Traceback" not in err
    assert not (tmp_path / "emu").exists() or not any((tmp_path / "emu").iterdir())


def test_manifest_and_tpu_do_not_mix(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["up", "--manifest", "x.yaml", "--tpu", "v6e:4x4"])
    assert exited.value.code == 2
    assert "argument --tpu: not allowed with argument --manifest" in capsys.readouterr().err


def test_up_and_down_take_the_same_options_in_a_cell_and_a_shell() -> None:
    """One definition (raytpu_lab.options) serves both parsers: same options, same defaults."""
    from raytpu_lab.cluster.emulator import DEFAULT_NAME
    from raytpu_lab.magics import build_parser

    def options(parser, command: str) -> dict[str, object]:
        sub = cli._subparser(parser, command)
        return {a.dest: (a.default, a.help) for a in sub._actions if a.dest != "help"}

    for command in ("up", "down"):
        assert options(cli._parser(), command) == options(build_parser(), command), command
    parsed = build_parser().parse_args(["up", "--tpu", "v6e:4x4", "--tpu", "v4:2x2x2"])
    assert parsed.tpu == ["v6e:4x4", "v4:2x2x2"]
    assert f"default {DEFAULT_NAME}," in options(cli._parser(), "up")["name"][1]


def test_a_long_manifest_name_is_cut_to_fit_rays_socket_paths(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from raytpu_lab.cluster import emulator
    from raytpu_lab.kuberay import emulate as kuberay_emulator

    monkeypatch.setenv("RAYTPU_EMULATOR_ROOT", "/tmp/raytpu")
    asked: list[str] = []
    monkeypatch.setattr(emulator, "up", lambda **kw: asked.append(kw["name"]))
    sample = Path(__file__).parents[1] / "fixtures/kuberay_samples/ray-cluster.tpu-v4-multihost.yaml"
    kuberay_emulator.up_from_manifest(sample)
    # metadata.name, 27 characters; 23 leave room for the head's dashboard module sockets
    # (<folder>/ray/session_.../sockets/dash_MetricsHead) with a 7-digit pid
    assert asked == ["raycluster-tpu-v4-multi"]
    emulator._check_socket_room(emulator.state_root() / asked[0])  # fits
    with pytest.raises(Exception, match="too long"):
        emulator._check_socket_room(emulator.state_root() / (asked[0] + "t"))


def test_unknown_arguments_are_blamed_on_the_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["status", "--bogus"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "usage: raytpu status" in err
    assert "raytpu status: error: unrecognized arguments: --bogus (see raytpu status --help)" in err


def test_a_bad_shape_suggests_the_nearest_in_up_syntax(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["up", "--tpu", "v6e:4x5"]) == 1
    err = capsys.readouterr().err
    assert "Use the nearest valid shape: --tpu v6e:4x4 (or 2x8, 4x8)." in err


def test_check_of_a_cluster_that_is_not_running_says_so(capsys: pytest.CaptureFixture[str],
                                                        tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("RAYTPU_EMULATOR_ROOT", str(tmp_path))
    assert cli.main(["check", "--name", "nope"]) == 1
    assert "No emulated cluster 'nope' is running" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["check", "--timeout", "0"])
    assert "must be a finite number above 0" in capsys.readouterr().err
