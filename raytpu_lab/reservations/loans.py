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
   (the run handle's stop: Ray Train's controller abort) and raise
   :class:`~raytpu_lab.errors.ReservationError`. Never silently elsewhere.
5. When the run ends, take the slices back for the reservation (same name, lifetime, slices).

Limits: between steps 2 and 3 another Ray user who asks for that pod type's head without our
checks (bare ``slice_placement_group``, another ``JaxTrainer``) can win the reserved head first;
then our run waits and is aborted after ``wait_s``. Taking the slices back in step 5 can lose the
same race; the error says so and the run's result is kept.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from ray.util.placement_group import placement_group

from raytpu_lab.advice import cmd, opt
from raytpu_lab.errors import ReservationError
from raytpu_lab.reservations.slices import Reservation, _remove_quietly, reserve_slices
from raytpu_lab.state.snapshot import ClusterSnapshot
from raytpu_lab.tpu.labels import LABEL_SLICE, LABEL_WORKER

__all__ = ["SliceLoan", "FENCE_PREFIX"]

FENCE_PREFIX = "raytpu-fence:"


class SliceLoan:
    """Lends reservation ``res``'s slices to one Ray Train run (steps 1-5 of the module docstring).

    Call :meth:`begin` just before starting the run, then :meth:`end` once it has ended (from any
    thread). ``abort`` (given to :meth:`begin`) must stop the run; the watcher calls it if the
    run does not land on the reserved slices.

    Args:
        res: The reservation to lend (this session's). Its placement groups are replaced by new
            ones on the same slices in :meth:`end`.
        snapshot: Returns a cluster snapshot.
        raw_state: Returns the raw state (placement groups with bundles).
        wait_s: Seconds the run may take to land on the slices before it is aborted.
        poll_s: Seconds between placement checks.
    """

    def __init__(self, res: Reservation, snapshot: Callable[[], ClusterSnapshot],
                 raw_state: Callable[[], Mapping[str, Any]], *, wait_s: float = 60.0,
                 poll_s: float = 0.2) -> None:
        self.res = res
        self._snapshot = snapshot
        self._raw_state = raw_state
        self._wait_s = wait_s
        self._poll_s = poll_s
        self._fences: list[Any] = []
        self._known: set[str] = set()
        self._heads: dict[str, str | None] = {}
        self._phase = "head"
        self.problem = ""
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None
        self._ended = False

    def begin(self, abort: Callable[[], Any]) -> None:
        """Fence the other slices' heads, give up the reservation's head locks, start watching."""
        shape, ours = self.res.shape, set(self.res.slice_names)
        snap = self._snapshot()
        self._heads = {s.name: s.hosts[0].node_id for s in snap.slices_of(shape.pod_type)}
        self._fences = [
            placement_group(bundles=[{shape.head_resource: 1}],
                            bundle_label_selector=[{LABEL_SLICE: s.name, LABEL_WORKER: "0"}],
                            name=f"{FENCE_PREFIX}{self.res.name}:{s.name}")
            for s in snap.slices_of(shape.pod_type)
            if s.name not in ours and s.hosts[0].alive and not s.head_locked]
        self._known = {g["placement_group_id"] for g in self._raw_state()["placement_groups"]} | {
            f.id.hex() for f in self._fences}
        for lock in self.res.head_locks:
            _remove_quietly(lock)
        self.res.head_locks = []
        self._watcher = threading.Thread(target=self._watch, args=(abort,),
                                         name=f"raytpu-lend-{self.res.name}", daemon=True)
        self._watcher.start()

    def _watch(self, abort: Callable[[], Any]) -> None:
        shape, ours = self.res.shape, list(self.res.slice_names)
        deadline = time.monotonic() + self._wait_s
        while not self._stop.wait(self._poll_s):
            groups = [g for g in self._raw_state()["placement_groups"]
                      if g["placement_group_id"] not in self._known]
            new_heads = {b["node_id"] for g in groups for b in g["bundles"]
                         if b["node_id"] and shape.head_resource in b["resources"]}
            if self._phase == "head" and all(self._heads.get(s) in new_heads for s in ours):
                _free_chips(self.res)  # the run holds our heads: let its worker group take the chips
                self._phase = "chips"
            if self._phase == "chips":
                snap = self._snapshot()
                run_owners = {f"placement group {g['placement_group_id'][:8]}" for g in groups}
                landed = {s.name for s in snap.slices_of(shape.pod_type)
                          if set(s.owners) & run_owners}
                if landed - set(ours):
                    self.problem = f"it landed on {sorted(landed - set(ours))}"
                elif landed == set(ours):
                    self._remove_fences()
                    self._phase = "placed"
                    return
            if time.monotonic() > deadline:
                waiting = "their heads" if self._phase == "head" else "their chips"
                self.problem = (f"it did not take the reserved slices within {self._wait_s:.0f} s "
                                f"(waiting for {waiting})")
            if self.problem:
                abort()
                return

    def end(self) -> ReservationError | None:
        """After the run: remove the fences, take the slices back for the reservation.

        Idempotent. Returns the error to raise (the run did not land on the reservation and was
        aborted, or the slices could not be taken back), else ``None``.
        """
        if self._ended:
            return None
        self._ended = True
        self._stop.set()
        if self._watcher is not None and self._watcher is not threading.current_thread():
            self._watcher.join(timeout=15)
        self._remove_fences()
        res, ours = self.res, list(self.res.slice_names)
        _free_chips(res)
        back = reserve_slices(res.shape, ours, name=res.name, timeout_s=30.0,
                              detached=res.detached)
        if back is not None:
            res.handle, res.head_locks, res.adopted_group = back.handle, back.head_locks, None
        if self.problem:
            return ReservationError(
                f"The training run did not run on reservation {res.name!r} ({', '.join(ours)}): "
                f"{self.problem}; it was aborted.",
                why="Ray Train picks its slice itself (it refuses label_selector with "
                    "use_tpu=True); raytpu_lab fences every other slice's head, so another Ray "
                    "user must have taken the reserved head first.",
                fix=("Check ", cmd("status"), " and run again; or run without ", opt("reservation"), "."))
        if back is None:
            return ReservationError(
                f"The run finished, but reservation {res.name!r} could not take back "
                f"{', '.join(ours)} within 30 s; the reservation is gone.",
                why="Another driver reserved the slices after the run freed them.",
                fix=("Reserve again (", cmd("reserve", "..."), "). The run's result is in last_run."))
        return None

    def _remove_fences(self) -> None:
        for f in self._fences:
            _remove_quietly(f)
        self._fences = []


def _free_chips(res: Reservation) -> None:
    if res.handle is not None:
        res.handle.shutdown()  # type: ignore[no-untyped-call]
    if res.adopted_group is not None:
        _remove_quietly(res.adopted_group)
        res.adopted_group = None

