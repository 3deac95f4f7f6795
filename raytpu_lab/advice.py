"""Neutral advice: the commands and options an error's message names, spelled per front end.

The core raises :class:`raytpu_lab.errors.RaytpuError` with parts that may hold a :class:`Cmd`
(a session command: release NAME, reserve, connect ADDRESS, ...) or an :class:`Opt` (an option
or argument by its neutral name: ``slices``, ``timeout``, ...). Each front end spells them in one
place with :func:`spell`:

========  ==============================  ==================  =================================
front     command                         option              where
========  ==============================  ==================  =================================
python    ``lab.release('r1')``           ``timeout_s=60``    ``str(err)`` (the default)
cell      ``%raytpu release r1``          ``--timeout 60``    raytpu_lab/magics/brief.py
shell     ``raytpu down --name X``        ``--timeout 60``    raytpu_lab/cli.py
========  ==============================  ==================  =================================

The shell has only ``up``, ``down``, ``list`` and ``status``; other commands are spelled as in a
cell, marked as notebook commands. Pure: imports nothing of the package, nothing of Ray.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, TypeAlias

__all__ = ["Cmd", "Opt", "Part", "Text", "Front", "FRONTS", "OPTIONS", "cmd", "opt", "spell"]

Front: TypeAlias = Literal["python", "cell", "shell"]
FRONTS: tuple[Front, ...] = ("python", "cell", "shell")

Value: TypeAlias = "str | int | float | bool | dict[str, object] | None"


@dataclass(frozen=True)
class Opt:
    """An option or argument by its neutral name (a key of :data:`OPTIONS`).

    Attributes:
        name: Neutral name, e.g. ``"timeout"``, ``"slices"``.
        value: The value to show; ``None`` shows the option alone (``--timeout`` / ``timeout_s=``).
            A placeholder (``"NAME"``) is a string like any other (quoted in Python).
    """

    name: str
    value: Value = None

    def __post_init__(self) -> None:
        if self.name not in OPTIONS:
            raise KeyError(f"advice: unknown option {self.name!r}")


@dataclass(frozen=True)
class Cmd:
    """A session command (a key of :data:`_ACTIONS`) with positional arguments and options.

    Attributes:
        action: Neutral action, e.g. ``"release"``, ``"reservations-all"``, ``"connect-kuberay"``.
        args: Positional arguments (names, addresses; ``"..."`` for "the usual arguments").
        opts: Options, in order.
    """

    action: str
    args: tuple[Value, ...] = ()
    opts: tuple[Opt, ...] = ()

    def __post_init__(self) -> None:
        if self.action not in _ACTIONS:
            raise KeyError(f"advice: unknown action {self.action!r}")


Part: TypeAlias = "str | Cmd | Opt"
# A message: a plain string, or parts joined without separators.
Text: TypeAlias = "str | Sequence[Part]"


def cmd(action: str, *args: Value, **opts: Value) -> Cmd:
    """``cmd("down", name="x")``: a :class:`Cmd` with options given by neutral name."""
    return Cmd(action, tuple(args), tuple(Opt(k, v) for k, v in opts.items()))


def opt(name: str, value: Value = None) -> Opt:
    """``opt("slices", 0)``: an :class:`Opt`."""
    return Opt(name, value)


# The one table of option spellings: neutral name -> (cell/shell flag, Python keyword).
# Most options are spelled `--name` in a cell or shell and `name=` in Python; the rest differ.
# A flag of None: a cell has no such option (said so when spelled).
_SAME_NAME = ("slices", "profile", "config", "name", "reservation", "backend", "yes", "context",
              "kubeconfig", "tpu", "topology", "version", "all", "kuberay", "namespace",
              "replicas", "app", "rps", "concurrency")
OPTIONS: dict[str, tuple[str | None, str]] = {
    **{name: (f"--{name}", name) for name in _SAME_NAME},
    "timeout": ("--timeout", "timeout_s"),
    "max_failures": ("--max-failures", "max_failures"),
    "wait": (None, "wait_s"),
    "cluster": ("--cluster", "name"),  # scale: --cluster in a cell, name= in Python
    "address": ("", "address"),  # connect --kuberay NAME ADDRESS: positional in a cell
    "duration": ("--duration", "duration_s"),
}

# neutral action -> (cell words, Python call, shell words or None when the shell lacks it).
# Most actions are cell-only and named alike in a cell and in Python (`reserve` / `lab.reserve`).
_CELL_AND_PYTHON = ("connect", "reserve", "release", "reservations", "attach", "apply", "serve")
_ACTIONS: dict[str, tuple[str, str, str | None]] = {
    **{action: (action, f"lab.{action}", None) for action in _CELL_AND_PYTHON},
    "up": ("up", "lab.up", "up"),
    "down": ("down", "lab.down", "down"),
    "status": ("status", "lab.status", "status"),
    "connect-kuberay": ("connect --kuberay", "lab.connect_kuberay", None),
    "reservations-all": ("reservations --all", "lab.cluster_reservations", None),
    "delete": ("delete", "lab.delete_raycluster", None),
    "serve-status": ("serve status", "lab.serve_status", None),
    "serve-delete": ("serve delete", "lab.serve_delete", None),
    "serve-load": ("serve load", "lab.serve_load", None),
}


def _py_value(value: Value) -> str:
    # placeholders stay quoted strings ('NAME'), so the spelled call is valid Python
    return "..." if value == "..." else repr(value)


def _cell_value(value: Value) -> str:
    if isinstance(value, dict):
        return f'"{value!r}"'
    text = str(value)
    return f'"{text}"' if " " in text else text


def _spell_opt(o: Opt, front: Front) -> str:
    flag, keyword = OPTIONS[o.name]
    if front == "python":
        return f"{keyword}=" if o.value is None else f"{keyword}={_py_value(o.value)}"
    if flag is None:  # no such cell/shell option: name the Python keyword honestly
        return f"{keyword}= (a Python argument; a cell has no option for it)"
    if o.value is None or o.value is True:
        return flag
    if not flag:
        return _cell_value(o.value)
    return f"{flag} {_cell_value(o.value)}"


def _spell_cmd(c: Cmd, front: Front) -> str:
    cell, call, shell = _ACTIONS[c.action]
    if front == "python":
        params = [_py_value(a) for a in c.args] + [_spell_opt(o, "python") for o in c.opts]
        return f"{call}({', '.join(params)})"
    words = " ".join([cell, *(_cell_value(a) for a in c.args), *(_spell_opt(o, front) for o in c.opts)])
    if front == "shell":
        if shell is not None:
            return "raytpu " + words.replace(cell, shell, 1)
        return f"in a notebook: %raytpu {words}"
    return f"%raytpu {words}"


def spell(text: Text, front: Front = "python") -> str:
    """``text`` as ``front`` writes it: commands and options in its syntax, strings as they are.

    Args:
        text: A plain string, or a sequence of strings, :class:`Cmd` and :class:`Opt` parts.
        front: ``"python"`` (API calls, keywords), ``"cell"`` (``%raytpu`` magics, ``--flags``)
            or ``"shell"`` (the ``raytpu`` command, notebook spelling where it has no such command).

    Returns:
        One string.
    """
    if isinstance(text, str):
        return text
    out: list[str] = []
    for part in text:
        if isinstance(part, Cmd):
            out.append(_spell_cmd(part, front))
        elif isinstance(part, Opt):
            out.append(_spell_opt(part, front))
        else:
            out.append(part)
    return "".join(out)
