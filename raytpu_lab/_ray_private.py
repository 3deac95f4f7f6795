"""Every use of Ray's private modules, in one place, so a Ray upgrade breaks only this file.

Checked against Ray 2.60.0.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterable, Iterator
from typing import Any

__all__ = ["abort_train_controller", "remove_placement_group_by_id", "available_resources_per_node",
           "controller_announcer", "restart_reporter", "ensure_auth_token", "enable_token_auth",
           "muted_worker_logs", "wrap_train_report", "ray_cli_main", "route_agents",
           "fresh_node_id", "serve_client", "serve_http_port", "kv_put", "kv_get", "kv_list",
           "kv_del", "placement_group_creator_names", "chip_holders_on_node",
           "actor_descriptions", "job_is_dead"]


def available_resources_per_node() -> dict[str, dict[str, float]]:
    """``{node id (hex): {resource: available amount}}`` for live nodes.

    From ``ray._private.state.available_resources_per_node`` (a DeveloperAPI). Ray omits a resource
    whose available amount is zero, so a missing key means "none left", not "all free".
    """
    from ray._private import state

    result: dict[str, dict[str, Any]] = state.available_resources_per_node()
    return result


def placement_group_creator_names(pg_ids: Iterable[str]) -> dict[str, str]:
    """``{placement group id (hex): name of the live actor that created it}`` for those of
    ``pg_ids`` an actor with a name created (an actor without one, or a driver, is left out).

    Ray's public tables name neither (``ray.util.placement_group_table()``, the state API's
    ``list_placement_groups``), but the GCS keeps ``creator_actor_id`` on each group
    (``gcs_pb2.PlacementGroupTableData``, Ray 2.60) and the actor table its name: a Serve
    replica's actor is named ``SERVE_REPLICA::<app>#<deployment>#<id>``, so a group Ray Serve
    LLM's replica makes for its own slice (``ray.util.tpu.slice_placement_group`` from
    ``ray/llm/_internal/serve/core/configs/accelerators.py``, unnamed or ``dp_<rank>``) is
    traced to its app. Read through ``ray._private.state.state``'s GCS accessor, once per
    group: a group's creator never changes, so the map's refresh asks the GCS only about
    groups it has not seen.
    """
    ids = list(pg_ids)
    unseen = {pg for pg in ids if pg not in _CREATOR_NAMES}
    if unseen:
        if len(_CREATOR_NAMES) > 10_000:
            _CREATOR_NAMES.clear()
        _CREATOR_NAMES.update(_look_up_creator_names(unseen))
    return {pg: _CREATOR_NAMES[pg] for pg in ids if _CREATOR_NAMES.get(pg)}


def _look_up_creator_names(pg_ids: set[str]) -> dict[str, str]:
    """``{id: creator actor's name, or "" (no live named creator)}`` for each of ``pg_ids``."""
    import ray
    from ray._private.state import state
    from ray.core.generated import gcs_pb2

    accessor = state._connect_and_get_accessor()
    creators: dict[str, str] = {}  # placement group -> its live creator actor (hex)
    for raw in accessor.get_placement_group_table():
        info = gcs_pb2.PlacementGroupTableData.FromString(raw)  # type: ignore[attr-defined]
        pg_id, actor = info.placement_group_id.hex(), info.creator_actor_id
        if pg_id not in pg_ids or not actor or info.creator_actor_dead \
                or ray.ActorID(actor).is_nil():
            continue
        creators[pg_id] = actor.hex()
    actors = actor_descriptions(creators.values())
    return {pg: actors.get(creators.get(pg, ""), {}).get("name", "") for pg in pg_ids}


_CREATOR_NAMES: dict[str, str] = {}


def chip_holders_on_node(address: str, port: int, timeout_s: float = 2.0) -> list[dict[str, Any]]:
    """The worker processes on one node that hold ``TPU`` chips, with Ray's chip ids:
    ``[{"chips": [1, 2], "actor_id": hex or "" (a task), "job_id": hex, "pid": int,
    "placement_group_id": hex or "" (none)}]``.

    Ray's public state names no chip ids (the state API's actors and tasks have only resource
    amounts); the raylet does: its ``GetNodeStats`` reply lists each core worker's
    ``used_resources`` with resource slots (``node_manager.proto`` / ``common.proto``
    ``CoreWorkerStats.used_resources``, Ray 2.60), the same ids Ray puts in the worker's
    ``TPU_VISIBLE_CHIPS``. Asked through ``ray._private.internal_api``'s channel (token auth
    included), one round trip per node (~5-50 ms).

    Args:
        address: The node's ``NodeManagerAddress``.
        port: Its ``NodeManagerPort``.
        timeout_s: Seconds to wait for the raylet.

    Raises:
        grpc.RpcError: The raylet did not answer in time.
    """
    from ray.core.generated import node_manager_pb2

    reply = _raylet_stub(address, port).GetNodeStats(
        node_manager_pb2.GetNodeStatsRequest(include_memory_info=False),  # type: ignore[attr-defined]
        timeout=timeout_s)
    holders: list[dict[str, Any]] = []
    for worker in reply.core_workers_stats:
        chips: set[int] = set()
        group = ""
        for name, allocation in worker.used_resources.items():
            # Inside a placement group Ray renames the resource: TPU_group_<pg id> and
            # TPU_group_<bundle index>_<pg id>, with the node's own chip ids as slots.
            if name == "TPU" or name.startswith("TPU_group_"):
                chips.update(int(slot.slot) for slot in allocation.resource_slots)
                if name != "TPU":
                    group = name.rsplit("_", 1)[1]
        if not chips:
            continue
        actor = worker.actor_id.hex()
        holders.append({"chips": sorted(chips), "job_id": worker.job_id.hex(),
                        "actor_id": "" if actor.strip("0f") == "" else actor,  # nil: all ff
                        "pid": int(worker.pid), "placement_group_id": group})
    return holders


@functools.lru_cache(maxsize=256)
def _raylet_stub(address: str, port: int) -> Any:
    from ray._common.network_utils import build_address
    from ray._private.grpc_utils import init_grpc_channel
    from ray.core.generated import node_manager_pb2_grpc

    return node_manager_pb2_grpc.NodeManagerServiceStub(  # type: ignore[no-untyped-call]
        init_grpc_channel(build_address(address, port)))


def actor_descriptions(actor_ids: Iterable[str]) -> dict[str, dict[str, str]]:
    """``{actor id (hex): {"class_name", "name", "placement_group_id"}}`` from the GCS's actor
    table (``gcs_pb2.ActorTableData``, Ray 2.60), read once per actor: none of these change
    over an actor's life. An actor the GCS does not know is left out.
    """
    ids = list(actor_ids)
    unseen = [a for a in ids if a not in _ACTORS]
    if unseen:
        import ray
        from ray._private.state import state
        from ray.core.generated import gcs_pb2

        if len(_ACTORS) > 10_000:
            _ACTORS.clear()
        accessor = state._connect_and_get_accessor()
        for actor_id in unseen:
            raw = accessor.get_actor_info(ray.ActorID(bytes.fromhex(actor_id)))
            if not raw:
                continue
            info = gcs_pb2.ActorTableData.FromString(raw)  # type: ignore[attr-defined]
            pg = info.placement_group_id.hex()
            _ACTORS[actor_id] = {"class_name": str(info.class_name), "name": str(info.name),
                                 "placement_group_id": "" if pg.strip("0") == "" else pg}
    return {a: _ACTORS[a] for a in ids if a in _ACTORS}


_ACTORS: dict[str, dict[str, str]] = {}


def job_is_dead(job_id: str) -> bool:
    """Whether the GCS marks job ``job_id`` (hex) dead: its driver exited or its connection
    dropped (``ray._private.state.jobs()``, the GCS job table's ``is_dead``, Ray 2.60). A job
    the table does not list counts as dead.
    """
    from ray._private import state

    for job in state.jobs():  # type: ignore[no-untyped-call]
        if job.get("JobID") == job_id:
            return bool(job.get("IsDead"))
    return True


def ensure_auth_token() -> None:
    """Make sure Ray's default token file (``~/.ray/auth_token``) exists, as ``ray get-auth-token
    --generate`` would; Ray 2.60 uses it for clusters started with ``RAY_AUTH_MODE=token``.
    """
    from ray._private.authentication import authentication_token_setup as setup

    if not setup._get_default_token_path().exists():
        setup.generate_and_save_token()


def enable_token_auth() -> None:
    """Turn on Ray token auth for this process and its children (``RAY_AUTH_MODE=token``).

    Setting the variable alone is not enough once Ray's C++ config has been read in this process;
    Ray's own ``_enable_token_auth`` re-initialises it.
    """
    from ray._private.authentication import authentication_token_setup as setup

    setup._enable_token_auth()


@functools.cache
def _announcer_class() -> type:
    # Built on first use so that importing this module does not import Ray Train. Defined in a
    # function, cloudpickle ships the class by value to the controller actor.
    from ray.train.v2._internal.execution.callback import ControllerCallback

    class _AnnounceController(ControllerCallback):  # type: ignore[misc]
        def __init__(self, send: Callable[[Any], None]) -> None:
            self._send = send

        def after_controller_start(self, train_run_context: Any) -> None:
            import ray

            try:
                self._send(ray.get_runtime_context().current_actor)
            except Exception:  # never fail the run for the sake of the Stop button
                pass

    return _AnnounceController


def controller_announcer(send: Callable[[Any], None]) -> Any:
    """A Ray Train callback that calls ``send(controller actor handle)`` when the run starts.

    Ray Train V2 (2.60) runs each ``fit()`` in a ``TrainController`` actor and keeps its handle
    private to ``fit()`` (where only a SIGINT handler in the main thread can reach it). A
    ``ControllerCallback`` (``ray.train.v2._internal.execution.callback``; ``RunConfig`` accepts
    any ``RayTrainCallback``) runs inside that actor, so it can hand out the handle; ``send`` runs
    there too (e.g. a ``ray.util.queue.Queue.put_nowait``).
    """
    return _announcer_class()(send)


@functools.cache
def _restart_reporter_class() -> type:
    from ray.train.v2._internal.execution.callback import ControllerCallback

    class _ReportRestarts(ControllerCallback):  # type: ignore[misc]
        def __init__(self, send: Callable[[dict[str, Any]], None]) -> None:
            self._send = send

        def after_controller_state_update(self, previous_state: Any, current_state: Any) -> None:
            import time

            from ray.train.v2._internal.execution.controller.state import (
                ReschedulingState,
                RestartingState,
            )

            if not isinstance(current_state, RestartingState | ReschedulingState):
                return
            state = "RESTARTING" if isinstance(current_state, RestartingState) else "RESCHEDULING"
            err = getattr(current_state, "training_failed_error", None)
            failures = getattr(err, "worker_failures", None) or {}
            try:
                self._send({"kind": "restart", "time": time.time(), "state": state,
                            "errors": {int(rank): f"{type(exc).__name__}: {exc}"[:2000]
                                       for rank, exc in failures.items()},
                            "error": str(err)[:2000] if err is not None else ""})
            except Exception:  # never fail the run for the sake of its view
                pass

    return _ReportRestarts


def restart_reporter(send: Callable[[dict[str, Any]], None]) -> Any:
    """A Ray Train callback that calls ``send(event)`` each time the run's controller decides to
    restart (``RESTARTING``: the worker group failed while running; ``RESCHEDULING``: it failed
    to start), in the controller actor.

    ``event``: ``{"kind": "restart", "time": epoch seconds, "state", "errors": {rank: text},
    "error": text}``. From ``after_controller_state_update`` of a ``ControllerCallback`` (Ray 2.60,
    ``ray/train/v2/_internal/execution/controller/state.py``: ``RestartingState`` and
    ``ReschedulingState`` carry the ``TrainingFailedError``, whose ``worker_failures`` maps each
    failed rank to its exception).
    """
    return _restart_reporter_class()(send)


def remove_placement_group_by_id(pg_id: str) -> None:
    """``ray.util.remove_placement_group`` for a placement group known only by its hex id (as
    ``ray.util.placement_group_table()`` lists it); building the handle needs Ray's id class."""
    import ray
    from ray.util.placement_group import PlacementGroup

    ray.util.remove_placement_group(PlacementGroup(ray.PlacementGroupID.from_hex(pg_id)))


def abort_train_controller(controller: Any, timeout_s: float) -> None:
    """Abort a Ray Train V2 run from any thread: what ``fit()``'s own SIGINT handler does.

    ``TrainController.abort`` (Ray 2.60, ``ray/train/v2/_internal/execution/controller``) runs the
    abort callbacks, shuts the worker group down (which removes its placement group) and exits the
    actor, so the call itself ends in ``RayActorError``. While the controller starts its worker
    group it does not serve calls (``WorkerGroup._start`` blocks its event loop on ``ray.get``), so
    if abort has not finished within ``timeout_s`` seconds the actor is killed instead: its
    workers die with it, but a placement group it made stays (Ray Train registers it with its
    cleaner only once the group has started); the caller must remove that one.
    """
    import ray

    try:
        ray.get(controller.abort.remote(), timeout=timeout_s)
    except ray.exceptions.RayActorError:
        return  # the controller exited, as abort() does
    except ray.exceptions.GetTimeoutError:
        ray.kill(controller, no_restart=True)


_MUTED: list[Callable[[dict[str, Any]], bool]] = []


@contextlib.contextmanager
def muted_worker_logs(is_muted: Callable[[dict[str, Any]], bool]) -> Iterator[None]:
    """Stop Ray from printing some workers' log batches in this driver while the block runs.

    Ray's driver prints every worker's stdout/stderr (``ray.init(log_to_driver=True)``) through
    the handler ``"ray_print_logs"`` of ``ray._private.ray_logging.global_worker_stdstream_dispatcher``,
    from a background thread; in a notebook that floods whichever cell connected. For a run whose
    logs a dashboard shows, batches for which ``is_muted(batch)`` is true (``batch`` has ``pid``,
    ``ip``, ``lines``...) are dropped; Ray's log files and other workers are untouched. Blocks may
    overlap (runs in the background).
    """
    from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher

    with dispatcher._lock:
        _MUTED.append(is_muted)
        dispatcher.handlers = [
            (name, _filtered(handler) if name == "ray_print_logs"
             and not hasattr(handler, "_raytpu_filter") else handler)
            for name, handler in dispatcher.handlers]
    try:
        yield
    finally:
        with dispatcher._lock:
            _MUTED.remove(is_muted)


def _filtered(handler: Callable[[Any], None]) -> Callable[[Any], None]:
    def handle(data: Any) -> None:
        for muted in list(_MUTED):
            try:
                if isinstance(data, dict) and muted(data):
                    return
            except Exception:
                continue
        handler(data)

    handle._raytpu_filter = True  # type: ignore[attr-defined]
    return handle


def wrap_train_report(hook: Callable[..., Any]) -> Callable[[], None]:
    """Route every ``ray.train.report`` of this Ray Train worker through ``hook(report, *args,
    **kwargs)``; returns a function that undoes it.

    Wraps the ``report`` of the worker's ``TrainFnUtils`` object
    (``ray.train.v2._internal.execution.train_fn_utils.get_train_fn_utils()``), which every
    public path reaches (``ray.train.report`` and a ``report`` imported from ``ray.train``);
    Ray's docstring of ``TrainFnUtils`` says it "can be patched if new user APIs behaviors is
    wanted". Call it inside the training function (the object exists only there).
    """
    from ray.train.v2._internal.execution.train_fn_utils import get_train_fn_utils

    utils = get_train_fn_utils()
    original = utils.report
    wrapped_before = "report" in utils.__dict__  # another hook's wrapper (nested hooks)

    def report(*args: Any, **kwargs: Any) -> Any:
        return hook(original, *args, **kwargs)

    utils.report = report  # type: ignore[method-assign]  # instance attribute: this worker only

    def undo() -> None:
        if utils.__dict__.get("report") is report:
            if wrapped_before:
                utils.report = original  # type: ignore[method-assign]  # the outer hook's
            else:
                del utils.report

    return undo


def ray_cli_main(argv: list[str] | None) -> int:
    """Run Ray's command line (``ray <argv>``) in this process; with ``None``, only import it.

    ``ray.scripts.scripts.main`` is what the ``ray`` console script runs (Ray 2.60); the
    emulator's launcher imports it once and forks a child per node to run ``ray start``.
    Returns the exit code (Ray's CLI ends with ``SystemExit``, which is turned into the code).
    """
    import sys

    from ray.scripts import scripts

    if argv is None:
        return 0
    sys.argv = ["ray", *argv]
    try:
        scripts.main()
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    return 0


def fresh_node_id() -> None:
    """Give the node this (forked) ``ray start`` creates an id of its own.

    Ray 2.60 draws node ids (``ray.NodeID.from_random``) from a C++ generator seeded once per
    process image, so every ``ray start`` forked from one launcher drew the same id and the GCS
    took each new host for the previous one (seen as 6 hosts started, 1 node alive). Ray's node
    reads ``RAY_OVERRIDE_NODE_ID_FOR_TESTING`` (``ray._private.node.Node.__init__``) before drawing;
    it is set here to 28 bytes from ``os.urandom`` (the size of a ``NodeID``).
    """
    import os

    os.environ["RAY_OVERRIDE_NODE_ID_FOR_TESTING"] = os.urandom(28).hex()


def route_agents(prefix: list[str]) -> None:
    """Make Ray start this process's nodes' dashboard and runtime-env agents as ``prefix +
    [agent script, args...]`` instead of ``python -u [agent script, args...]``.

    Ray 2.60 builds both agent commands in ``ray._private.services.start_raylet`` from
    ``_build_python_executable_command_memory_profileable(component, session_dir)`` (the
    interpreter and ``-u``) and hands them to the raylet (``--dashboard_agent_command``,
    ``--runtime_env_agent_command``); only those two components are routed. The emulator's node
    launcher calls this in the forked child that runs ``ray start`` for a host.
    """
    from ray._private import ray_constants, services

    original = services._build_python_executable_command_memory_profileable
    agents = {ray_constants.PROCESS_TYPE_DASHBOARD_AGENT,
              ray_constants.PROCESS_TYPE_RUNTIME_ENV_AGENT}

    def build(component: str, session_dir: str, unbuffered: bool = True) -> list[str]:
        if component in agents:
            return list(prefix)
        result: list[str] = original(component, session_dir, unbuffered)
        return result

    services._build_python_executable_command_memory_profileable = build


def serve_client() -> Any:
    """Ray Serve's client of the running Serve controller, or ``None`` when Serve is not running.

    ``ray.serve.context._get_global_client(raise_if_no_controller_running=False)`` (Ray 2.60);
    the public ``serve.status()`` would start Serve to answer.
    """
    from ray.serve.context import _get_global_client

    return _get_global_client(raise_if_no_controller_running=False)


def serve_http_port() -> int | None:
    """The HTTP port of the running Serve proxies (``ServeControllerClient.http_config.port``,
    Ray 2.60), or ``None`` when Serve is not running."""
    client = serve_client()
    return None if client is None else int(client.http_config.port)


# Ray's internal key-value store (GCS), namespace "raytpu": the run board
# (raytpu_lab/train/board.py) publishes live runs there and reads stop requests, so a process that
# is not the run's kernel (the Jupyter sidebar's poller) can list and stop runs without an actor.
_KV_NAMESPACE = "raytpu"


def kv_put(key: str, value: bytes) -> None:
    """Store ``value`` under ``key`` (overwrites). Needs ``ray.init`` first."""
    from ray.experimental import internal_kv

    internal_kv._internal_kv_put(key, value, overwrite=True, namespace=_KV_NAMESPACE)


def kv_get(key: str) -> bytes | None:
    """The value under ``key``, or ``None``."""
    from ray.experimental import internal_kv

    value = internal_kv._internal_kv_get(key, namespace=_KV_NAMESPACE)
    return value if isinstance(value, bytes) else None


def kv_list(prefix: str) -> list[str]:
    """Keys starting with ``prefix``."""
    from ray.experimental import internal_kv

    keys = internal_kv._internal_kv_list(prefix, namespace=_KV_NAMESPACE) or []
    return [k.decode() if isinstance(k, bytes) else str(k) for k in keys]


def kv_del(key: str) -> None:
    """Delete ``key`` (no error if absent)."""
    from ray.experimental import internal_kv

    internal_kv._internal_kv_del(key, namespace=_KV_NAMESPACE)
