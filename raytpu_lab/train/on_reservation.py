"""Lending a reservation's slices to a Ray Train run, so that the run lands exactly there.

Ray Train cannot be told where to go: with ``use_tpu=True`` it refuses ``label_selector``
(``ray.train.v2.api.config.ScalingConfig``), and its worker group makes its own
``SlicePlacementGroup`` without a selector, which first wins the ``TPU-<pod type>-head`` resource
of *any* slice of the pod type (``ray._private.accelerators.tpu.reserve_tpu_slice``) and then
gang-schedules the rest of that slice. So we steer it with Ray's own rule instead of a selector:

1. **Fence** every other slice of the pod type whose head is free: a placement group on its
   ``TPU-<pod type>-head`` (named ``raytpu-fence:<reservation>:<slice>``). Heads already held by
   others need no fence.
2. Drop the reservation's own head locks but keep its chips: the only head Ray Train can win is
   the reserved slice's worker 0, and no other reservation sees that slice idle meanwhile.
3. Once a new placement group holds the reserved slices' heads (the run's), free the
   reservation's chips; once the run holds the chips, remove the fences.
4. If the run does not land there within ``wait_s`` seconds, or lands elsewhere, abort it
   (``SIGINT`` to the driver: Ray Train's own handler aborts the controller) and raise
   :class:`~raytpu_lab.errors.ReservationError`. Never silently elsewhere.
5. When the run ends, take the slices back for the reservation (same name, lifetime, slices).

Limits: between steps 2 and 3 another Ray user who asks for that pod type's head without our
checks (bare ``slice_placement_group``, another ``JaxTrainer``) can win the reserved head first;
then our run waits and is aborted after ``wait_s``. Taking the slices back in step 5 can lose the
same race; the error says so and the run's result is kept.
"""

from __future__ import annotations

import _thread
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from ray.util.placement_group import placement_group

from raytpu_lab.errors import ReservationError
from raytpu_lab.reserve import Reservation, _remove_quietly, reserve_slices
from raytpu_lab.state.model import LABEL_SLICE, LABEL_WORKER, ClusterSnapshot

__all__ = ["lend_to_run", "FENCE_PREFIX"]

FENCE_PREFIX = "raytpu-fence:"


@contextmanager
def lend_to_run(res: Reservation, snapshot: Callable[[], ClusterSnapshot],
                raw_state: Callable[[], dict[str, Any]], *, wait_s: float = 60.0,
                poll_s: float = 0.2) -> Iterator[None]:
    """Within the block, the Ray Train run started there can only land on ``res``'s slices.

    Args:
        res: The reservation to lend (this session's). Its placement groups are replaced by new
            ones on the same slices when the block ends.
        snapshot: Returns a cluster snapshot.
        raw_state: Returns the raw state (placement groups with bundles).
        wait_s: Seconds the run may take to land on the slices before it is aborted.
        poll_s: Seconds between placement checks.

    Raises:
        ReservationError: The run did not land on the reserved slices in time (it was aborted),
            or the slices could not be taken back afterwards.
    """
    shape, ours = res.shape, list(res.slice_names)
    snap = snapshot()
    heads = {s.name: s.hosts[0].node_id for s in snap.slices_of(shape.pod_type)}
    fences = [placement_group(bundles=[{shape.head_resource: 1}],
                              bundle_label_selector=[{LABEL_SLICE: s.name, LABEL_WORKER: "0"}],
                              name=f"{FENCE_PREFIX}{res.name}:{s.name}")
              for s in snap.slices_of(shape.pod_type)
              if s.name not in ours and s.hosts[0].alive and not s.head_locked]
    known = {g["placement_group_id"] for g in raw_state()["placement_groups"]} | {
        f.id.hex() for f in fences}
    for lock in res.head_locks:
        _remove_quietly(lock)
    res.head_locks = []
    state = {"phase": "head", "problem": ""}
    stop = threading.Event()

    def watch() -> None:
        deadline = time.monotonic() + wait_s
        while not stop.wait(poll_s):
            groups = [g for g in raw_state()["placement_groups"]
                      if g["placement_group_id"] not in known]
            new_heads = {b["node_id"] for g in groups for b in g["bundles"]
                         if b["node_id"] and shape.head_resource in b["resources"]}
            if state["phase"] == "head" and all(heads.get(s) in new_heads for s in ours):
                _free_chips(res)  # the run holds our heads: let its worker group take the chips
                state["phase"] = "chips"
            if state["phase"] == "chips":
                snap = snapshot()
                run_owners = {f"placement group {g['placement_group_id'][:8]}" for g in groups}
                landed = {s.name for s in snap.slices_of(shape.pod_type)
                          if set(s.owners) & run_owners}
                if landed - set(ours):
                    state["problem"] = f"it landed on {sorted(landed - set(ours))}"
                elif landed == set(ours):
                    for f in fences:
                        _remove_quietly(f)
                    state["phase"] = "placed"
                    return
            if time.monotonic() > deadline:
                state["problem"] = (f"it did not take the reserved slices within {wait_s:.0f} s "
                                    f"(waiting for {'their heads' if state['phase'] == 'head' else 'their chips'})")
            if state["problem"]:
                _thread.interrupt_main()  # Ray Train's SIGINT handler aborts the run
                return

    watcher = threading.Thread(target=watch, name=f"raytpu-lend-{res.name}", daemon=True)
    watcher.start()
    failure: BaseException | None = None
    try:
        yield
    except KeyboardInterrupt as err:
        failure = err
    finally:
        stop.set()
        watcher.join(timeout=5)
        for f in fences:
            _remove_quietly(f)
        _free_chips(res)
        back = reserve_slices(shape, ours, name=res.name, timeout_s=30.0, detached=res.detached)
        if back is not None:
            res.handle, res.head_locks, res.adopted_group = back.handle, back.head_locks, None
    if state["problem"]:
        raise ReservationError(
            f"The training run did not run on reservation {res.name!r} ({', '.join(ours)}): "
            f"{state['problem']}; it was aborted.",
            why="Ray Train picks its slice itself (it refuses label_selector with use_tpu=True); "
                "raytpu_lab fences every other slice's head, so another Ray user must have taken "
                "the reserved head first.",
            fix="Check %raytpu status and run again; or run without --reservation.")
    if failure is not None:
        raise failure
    if back is None:
        raise ReservationError(
            f"The run finished, but reservation {res.name!r} could not take back {', '.join(ours)} "
            "within 30 s; the reservation is gone.",
            why="Another driver reserved the slices after the run freed them.",
            fix="Reserve again (%raytpu reserve ...). The run's result is in last_run.")


def _free_chips(res: Reservation) -> None:
    if res.handle is not None:
        res.handle.shutdown()
    if res.adopted_group is not None:
        _remove_quietly(res.adopted_group)
        res.adopted_group = None

