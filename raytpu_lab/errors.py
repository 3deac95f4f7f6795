"""Errors a user can cause, in one family.

Every error carries three parts: what happened, why, and what to do next. Magics print
``str(error)`` as one short block; the traceback appears only with ``--debug``. Advice names
commands and options neutrally (:mod:`raytpu_lab.advice`); ``str(error)`` spells it for Python,
a cell and the shell respell it (:meth:`RaytpuError.respell`, :meth:`RaytpuError.spelled`).

::

    RaytpuError
    ├── InvalidTopologyError        bad generation / topology / spec, raised before Ray is asked
    ├── NotConnectedError           an operation that needs a cluster, with none connected
    ├── ConnectError                nothing answers at a Ray address within the timeout
    ├── EmulatorError               the local emulated cluster could not start / is already running
    ├── ReservationError            a slice reservation failed
    │   └── NoSliceAvailableError   no intact idle slice within the timeout (names each slice and why)
    ├── TrainingConfigError         a training request that cannot run (bad config), before launch
    ├── TrainingError               a JaxTrainer run failed on the workers (carries the worker traceback)
    ├── RemoteHostError             a cell run on a reservation's hosts failed on a host (its traceback)
    ├── ManifestError               a RayCluster manifest fails the CRD schema or the TPU rules
    └── KubernetesError             kubeconfig, RBAC, RayCluster/CRD lookup or readiness on Kubernetes
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from raytpu_lab.advice import Front, Text, spell

if TYPE_CHECKING:  # for annotations only: the errors module imports only raytpu_lab.advice
    from raytpu_lab.spmd import CellResult, HostOutput

__all__ = [
    "RaytpuError",
    "InvalidTopologyError",
    "NotConnectedError",
    "ConnectError",
    "EmulatorError",
    "ReservationError",
    "NoSliceAvailableError",
    "TrainingConfigError",
    "TrainingError",
    "RemoteHostError",
    "ServeError",
    "ManifestError",
    "KubernetesError",
]


class RaytpuError(Exception):
    """Base of every error raised by raytpu_lab for something the user can fix.

    Each part is a plain string or neutral advice (:mod:`raytpu_lab.advice`: strings with
    :class:`~raytpu_lab.advice.Cmd` / :class:`~raytpu_lab.advice.Opt` parts); ``what``, ``why``,
    ``fix`` and ``str(error)`` are spelled for Python (``lab.release('r1')``, ``timeout_s=``)
    until a front end calls :meth:`respell` (a cell: ``%raytpu release r1``, ``--timeout``).

    Args:
        what: What happened, one sentence.
        why: Why it happened (the fact it rests on), or ``""``.
        fix: What to do next, or ``""``.

    Attributes:
        advice: The three parts as given (neutral), for :meth:`respell`.
        front: The front end the text is spelled for.
    """

    def __init__(self, what: Text, why: Text = "", fix: Text = "") -> None:
        self.advice: tuple[Text, Text, Text] = (what, why, fix)
        self.front: Front = "python"
        super().__init__()
        self.respell("python")

    def respell(self, front: Front) -> RaytpuError:
        """Spell this error's advice for ``front`` (in place: ``what``, ``why``, ``fix``,
        ``str(error)``); returns the error itself, so ``raise err.respell("cell")`` works."""
        self.front = front
        self._text = [spell(t, front) for t in self.advice]
        self.args = (self._compose(),)
        return self

    # Assigning a part (``err.fix += " Logs: ..."``) keeps that text, as spelled, in every front.
    def _set(self, i: int, value: str) -> None:
        self.advice = tuple(value if j == i else t for j, t in enumerate(self.advice))  # type: ignore[assignment]
        self._text[i] = value
        self.args = (self._compose(),)

    what = property(lambda self: self._text[0], lambda self, v: self._set(0, v),
                    doc="What happened, spelled for :attr:`front`.")
    why = property(lambda self: self._text[1], lambda self, v: self._set(1, v),
                   doc="Why it happened, spelled for :attr:`front` (or ``\"\"``).")
    fix = property(lambda self: self._text[2], lambda self, v: self._set(2, v),
                   doc="What to do next, spelled for :attr:`front` (or ``\"\"``).")

    def spelled(self, front: Front) -> str:
        """The error's block (what, why, what to do) spelled for ``front``; changes nothing."""
        return _compose(*(spell(t, front) for t in self.advice))

    def _render_traceback_(self) -> list[str]:
        """What IPython shows for this error instead of a traceback (one short block).

        IPython calls it when a cell raises; the cell still counts as failed, so "Run all" and
        headless runs stop here.
        """
        return [f"{type(self).__name__}: {self.what}", *self._compose().splitlines()[1:]]

    def _compose(self) -> str:
        return _compose(self.what, self.why, self.fix)


def _compose(what: str, why: str, fix: str) -> str:
    parts = [what]
    if why:
        parts.append(f"Why: {why}")
    if fix:
        parts.append(f"What to do: {fix}")
    return "\n".join(parts)


class InvalidTopologyError(RaytpuError, ValueError):
    """A generation, topology or spec that Ray would not accept.

    Raised before anything is requested from Ray.

    Attributes:
        version: The generation asked for (Ray's accelerator version, e.g. ``"v6e"``), or ``""``
            when it is unknown.
        topology: The topology asked for, as given, or ``""``.
        nearest: Valid topologies of ``version`` nearest to ``topology`` (chip count, then
            dimensions), nearest first; ``[]`` when there is nothing to compare. Front ends
            phrase them in the syntax of the command that failed (``--tpu v6e:4x4``,
            ``reserve 4x4 --version v6e``, ``--topology 4x4 --version v6e``).
    """

    def __init__(self, what: Text, why: Text = "", fix: Text = "", *, version: str = "",
                 topology: str = "", nearest: list[str] | None = None) -> None:
        self.version = version
        self.topology = topology
        self.nearest = list(nearest or [])
        super().__init__(what, why, fix)

    def in_syntax(self, form: str) -> InvalidTopologyError:
        """This error with its suggestion written the way the failed command takes a shape.

        Args:
            form: The command's shape syntax with ``{version}`` and ``{topology}``, e.g.
                ``"reserve {topology} --version {version}"`` or ``"--tpu {version}:{topology}"``.

        Returns:
            A copy whose fix names the nearest valid shape in that syntax (and the next nearest
            topologies), or this error itself when there is nothing to suggest.
        """
        if not self.nearest or not self.version:
            return self
        first, *others = self.nearest
        also = f" (or {', '.join(others)})" if others else ""
        fix = f"Use the nearest valid shape: {form.format(version=self.version, topology=first)}{also}."
        return InvalidTopologyError(self.advice[0], self.advice[1], fix, version=self.version,
                                    topology=self.topology, nearest=self.nearest)


class NotConnectedError(RaytpuError):
    """The operation needs a Ray cluster and the session has none."""


class ConnectError(RaytpuError):
    """Nothing answered at the Ray address within ``timeout_s`` seconds.

    Attributes:
        address: The address that was tried.
        timeout_s: How long we waited, in seconds.
    """

    def __init__(self, what: Text, why: Text = "", fix: Text = "", *, address: str = "",
                 timeout_s: float = 0.0) -> None:
        self.address = address
        self.timeout_s = timeout_s
        super().__init__(what, why, fix)


class EmulatorError(RaytpuError):
    """The local emulated TPU cluster could not be started or stopped as asked."""


class ReservationError(RaytpuError):
    """A slice reservation could not be made or released."""


class NoSliceAvailableError(ReservationError):
    """No intact, idle slice of the requested pod type became available in time.

    Attributes:
        pod_type: The requested pod type, e.g. ``"v6e-16"``.
        timeout_s: How long we waited, in seconds.
        slices_needed: How many slices were requested.
        slices_idle: How many intact idle slices the last snapshot showed.
        reasons: ``{slice name: why it cannot be used}`` for every slice of that pod type.
    """

    def __init__(self, what: Text, why: Text = "", fix: Text = "", *, pod_type: str = "",
                 timeout_s: float = 0.0, slices_needed: int = 1, slices_idle: int = 0,
                 reasons: dict[str, str] | None = None) -> None:
        self.pod_type = pod_type
        self.timeout_s = timeout_s
        self.slices_needed = slices_needed
        self.slices_idle = slices_idle
        self.reasons = dict(reasons or {})
        super().__init__(what, why, fix)


class TrainingConfigError(RaytpuError, ValueError):
    """A training request that cannot run as given; raised before anything is launched."""


class TrainingError(RaytpuError):
    """A training run failed on its workers.

    Attributes:
        run_name: The run's name.
        worker_error: The remote error text (with the worker's traceback), as Ray Train reported it.
    """

    def __init__(self, what: Text, why: Text = "", fix: Text = "", *, run_name: str = "",
                 worker_error: str = "") -> None:
        self.run_name = run_name
        self.worker_error = worker_error
        super().__init__(what, why, fix)


class RemoteHostError(RaytpuError):
    """A cell (or function) run on every host of a reservation failed on at least one host.

    ``why`` is the first failing host's traceback, as ipyparallel's ``RemoteError`` shows the
    engine's.

    Attributes:
        result: Every host's output for the cell (a ``raytpu_lab.reservations.spmd.CellResult``), or ``None``
            when the hosts could not run it at all.
        host: The first failing host's output (``raytpu_lab.reservations.spmd.HostOutput``: rank, slice name,
            worker id, traceback text in ``.error``), or ``None``.
    """

    def __init__(self, what: Text, why: Text = "", fix: Text = "", *,
                 result: CellResult | None = None, host: HostOutput | None = None) -> None:
        self.result = result
        self.host = host
        super().__init__(what, why, fix)


class ServeError(RaytpuError):
    """A Serve deployment on a reservation was refused before deploying, or failed to start.

    Attributes:
        host: ``"<slice> worker <id>"`` of the replica that failed, or ``""``.
        traceback: The replica's traceback text (from Ray Serve), or ``""``.
    """

    def __init__(self, what: Text, why: Text = "", fix: Text = "", *, host: str = "",
                 traceback: str = "") -> None:
        self.host = host
        self.traceback = traceback
        super().__init__(what, why, fix)


class ManifestError(RaytpuError, ValueError):
    """A RayCluster manifest that the Kubernetes API server or the KubeRay TPU webhook would refuse.

    Attributes:
        source: Where the manifest came from (a file name, or ``"manifest"``).
        problems: One line per problem, each naming the field path, e.g.
            ``"spec.workerGroupSpecs[0].numOfHosts: 2, but v6e 4x4 with 4 chips per host has 4 hosts"``.
    """

    def __init__(self, what: Text, why: Text = "", fix: Text = "", *, source: str = "",
                 problems: list[str] | None = None) -> None:
        self.source = source
        self.problems = list(problems or [])
        super().__init__(what, why, fix)


class KubernetesError(RaytpuError):
    """Talking to Kubernetes failed in a way the user can fix.

    Never carries a token, certificate or kubeconfig content: messages are composed from the HTTP
    status, the Kubernetes ``Status`` reason and our own words only.

    Attributes:
        kind: What failed: ``"no-kubeconfig"``, ``"context"``, ``"forbidden"``, ``"not-found"``,
            ``"crd-missing"``, ``"not-ready"``, ``"unreachable"``, ``"port-forward"`` or ``"api"``.
        status: The HTTP status the API server answered, or 0 when none.
    """

    def __init__(self, what: Text, why: Text = "", fix: Text = "", *, kind: str = "api",
                 status: int = 0) -> None:
        self.kind = kind
        self.status = status
        super().__init__(what, why, fix)
