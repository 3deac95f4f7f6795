"""Model FLOPs utilisation (MFU): the fraction of the chips' peak a run's steps reach. Pure.

``MFU = (model FLOPs per step / seconds per step / chips) / peak FLOP/s per chip``. The FLOPs of
a step come from XLA's own cost analysis of the jitted step (:func:`xla_flops`, called in the
training function, reported as the ``flops_per_step`` metric), or from the user
(``flops_per_step=``, or the ``flops_per_step`` key of the run's config). Seconds per step are
rank 0's steady steps (compile excluded; :attr:`RunResult.steps_per_s
<raytpu_lab.train.result.RunResult.steps_per_s>`). On the emulator the "chips" are CPU devices,
so a percentage of a TPU's peak would mean nothing: :class:`Mfu` then gives the FLOP/s and says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["EMULATED_NOTE", "PEAK_BF16_FLOPS", "Mfu", "compute_mfu", "peak_flops", "xla_flops"]

PEAK_BF16_FLOPS: dict[str, float] = {
    "v4": 275e12,
    "v5e": 197e12,
    "v5p": 459e12,
    "v6e": 918e12,
    "v7x": 2307e12,
}
"""Peak dense bf16 FLOP/s per chip, by Ray's accelerator version. Sources (Google Cloud TPU docs,
"System architecture" tables):

- v4: 275 TFLOPs, "Peak compute per chip (bf16 or int8)", https://cloud.google.com/tpu/docs/v4
- v5e: 197 TFLOPs, "Peak compute per chip (bf16)", https://cloud.google.com/tpu/docs/v5e (and the
  v5e column of https://cloud.google.com/tpu/docs/v6e)
- v5p: 459 TFLOPs, "Peak compute per chip (BF16)", https://cloud.google.com/tpu/docs/v5p (and the
  v5p column of https://cloud.google.com/tpu/docs/tpu7x)
- v6e (Trillium): 918 TFLOPs, "Peak compute per chip (bf16)", https://cloud.google.com/tpu/docs/v6e
- v7x (TPU7x, Ironwood): 2307 TFLOPs, "Peak compute per chip (BF16)" (4614 for FP8),
  https://cloud.google.com/tpu/docs/tpu7x; one chip is two TensorCores, which JAX shows as two
  devices: MFU here is per chip.
"""

_ALIASES = {"v5litepod": "v5e", "v5lite": "v5e", "tpu7x": "v7x", "v6": "v6e"}

EMULATED_NOTE = "CPU devices (emulated): MFU not meaningful"


def peak_flops(version: str) -> float | None:
    """Peak bf16 FLOP/s of one chip of ``version`` (e.g. ``"v6e"``, ``"v5litepod"``, ``"tpu7x"``),
    or ``None`` for a generation not in :data:`PEAK_BF16_FLOPS`."""
    key = version.lower().removeprefix("tpu-")
    return PEAK_BF16_FLOPS.get(_ALIASES.get(key, key))


@dataclass(frozen=True)
class Mfu:
    """A run's model FLOPs utilisation.

    Attributes:
        flops_per_step: Model FLOPs of one step, all chips together (``None``: unknown).
        step_s: Seconds per step (``None``: fewer than two steps).
        chips: TPU chips of the run.
        version: The accelerator version.
        peak_flops_per_chip: :func:`peak_flops` of it (``None``: not in the table).
        emulated: The devices are CPUs standing in for chips (the emulator).
        source: Where ``flops_per_step`` came from: ``"xla"`` (the step's cost analysis,
            reported by the function), ``"user"`` (``flops_per_step=`` or the config key), or ``""``.
    """

    flops_per_step: float | None
    step_s: float | None
    chips: int
    version: str
    peak_flops_per_chip: float | None
    emulated: bool = False
    source: str = ""

    @property
    def flops_per_s_per_chip(self) -> float | None:
        """Achieved FLOP/s per chip (``None`` without FLOPs or a step time)."""
        if not self.flops_per_step or not self.step_s or self.chips <= 0:
            return None
        return self.flops_per_step / self.step_s / self.chips

    @property
    def mfu(self) -> float | None:
        """Achieved over peak FLOP/s per chip, 0..1; ``None`` on the emulator, without a peak,
        or without achieved FLOP/s."""
        achieved = self.flops_per_s_per_chip
        if self.emulated or achieved is None or not self.peak_flops_per_chip:
            return None
        return achieved / self.peak_flops_per_chip

    @property
    def note(self) -> str:
        """Why :attr:`mfu` is missing, or ``""``."""
        if self.flops_per_step is None:
            return "FLOPs per step unknown: report flops_per_step (raytpu_lab.train.mfu.xla_flops) or pass it"
        if self.step_s is None:
            return "fewer than two steps: no step time"
        if self.emulated:
            return EMULATED_NOTE
        if self.peak_flops_per_chip is None:
            return f"no bf16 peak known for {self.version}"
        return ""

    def text(self) -> str:
        """``"MFU 41.2% (113.3 TFLOP/s per chip of 275 peak, v4)"``, or the FLOP/s and the note."""
        achieved = self.flops_per_s_per_chip
        rate = f"{_si(achieved)}FLOP/s per chip" if achieved is not None else ""
        if self.mfu is not None and self.peak_flops_per_chip:
            return (f"MFU {self.mfu:.1%} ({rate} of {_si(self.peak_flops_per_chip)}FLOP/s bf16 "
                    f"peak, {self.version})")
        return f"{rate}; {self.note}" if rate else self.note

    def to_dict(self) -> dict[str, Any]:
        """JSON-able: the attributes, ``flops_per_s_per_chip``, ``mfu`` and ``note``."""
        return {"flops_per_step": self.flops_per_step, "step_s": self.step_s, "chips": self.chips,
                "version": self.version, "peak_flops_per_chip": self.peak_flops_per_chip,
                "emulated": self.emulated, "source": self.source,
                "flops_per_s_per_chip": self.flops_per_s_per_chip, "mfu": self.mfu,
                "note": self.note}

    def __repr__(self) -> str:
        return f"Mfu({self.text()})"


def _si(value: float) -> str:
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.1f} {prefix}"
    return f"{value:.1f} "


def compute_mfu(flops_per_step: float | None, step_s: float | None, *, chips: int, version: str,
                emulated: bool = False, source: str = "") -> Mfu:
    """The :class:`Mfu` of steps of ``flops_per_step`` FLOPs (all chips) taking ``step_s`` s each
    on ``chips`` chips of ``version``.

    Raises:
        ValueError: ``flops_per_step`` or ``step_s`` is negative, or ``chips`` below 1.
    """
    if (flops_per_step is not None and flops_per_step < 0) or (step_s is not None and step_s < 0):
        raise ValueError(f"FLOPs per step ({flops_per_step}) and seconds per step ({step_s}) "
                         "cannot be negative")
    if chips < 1:
        raise ValueError(f"an MFU needs at least one chip, got {chips}")
    return Mfu(flops_per_step, step_s, chips, version, peak_flops(version), emulated, source)


def xla_flops(jitted: Any, *args: Any, **kwargs: Any) -> float:
    """FLOPs of one call of ``jitted`` (a ``jax.jit`` function) on ``args``, from XLA's cost
    analysis of the compiled program (``jitted.lower(*args).compile().cost_analysis()``), all
    devices together: XLA counts the program one device runs, so an SPMD-partitioned program's
    count is multiplied by the devices it runs on.

    Call it in the training function once (it compiles, which the jit cache then reuses) and
    report it: ``ray.train.report({"step": s, "loss": l, "flops_per_step": flops})``.

    Raises:
        ValueError: XLA gave no ``flops`` entry (some backends do not analyse costs).
    """
    compiled = jitted.lower(*args, **kwargs).compile()
    analysis = compiled.cost_analysis()
    if isinstance(analysis, list):  # older JAX: one dict per program
        analysis = analysis[0] if analysis else {}
    flops = (analysis or {}).get("flops")
    if flops is None:
        raise ValueError("XLA's cost analysis of this program has no 'flops' entry")
    devices = 1
    try:
        sharding = compiled.output_shardings
        leaves = sharding if isinstance(sharding, (list, tuple)) else [sharding]
        devices = max((len(s.device_set) for s in leaves if hasattr(s, "device_set")), default=1)
    except Exception:  # an executable without shardings: one device
        devices = 1
    return float(flops) * devices
