"""The emulated host's JAX start-up hook, in plain processes (no Ray): two processes of a 2-host
slice that hold their chips see 8 devices; a repeated ``jax.distributed.initialize()`` is a no-op;
a process that does not hold the chips is left alone."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from raytpu_lab.cluster._addresses import free_ports

_SITE = str(Path(__file__).resolve().parents[2] / "raytpu_lab" / "cluster" / "_site")

_PROGRAM = r"""
import json, sys
import _raytpu_jax_slice as hook          # loaded by the start-up hook
hook.holds_host_chips = lambda: sys.argv[1] == "holds"   # Ray's answer, without Ray
import jax
first = jax.device_count()
if sys.argv[1] == "holds":
    jax.distributed.initialize()          # JAX's documented first line: a no-op now
    from jax.experimental import multihost_utils
    multihost_utils.sync_global_devices("hook-test")   # a real cross-process barrier
print("\nRESULT", json.dumps([first, jax.process_index(), jax.process_count()]), flush=True)
"""


def _run(worker_id: int, coordinator: str, holds: bool) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([_SITE, os.environ.get("PYTHONPATH", "")]),
           "RAYTPU_SLICE_COORDINATOR": coordinator, "RAYTPU_SLICE_HOST_IPS": "127.0.0.1,127.0.0.1",
           "RAYTPU_CHIPS_PER_HOST": "4", "TPU_WORKER_ID": str(worker_id), "JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
    return subprocess.Popen([sys.executable, "-c", _PROGRAM, "holds" if holds else "no"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _result(out: tuple[str, str]) -> list[int]:
    """The program's RESULT line (printed after a newline and flushed: JAX or absl may leave a
    line unfinished on stdout); the process's output in the failure message when it is missing."""
    found = re.search(r"^RESULT (.*)$", out[0], re.MULTILINE)
    assert found, f"no RESULT line; stdout: {out[0][-1500:]!r} stderr: {out[1][-1500:]!r}"
    return json.loads(found.group(1))


def test_processes_holding_the_chips_see_the_slice_and_reinitialize_is_a_no_op() -> None:
    coordinator = f"127.0.0.1:{free_ports(1)[0]}"
    procs = [_run(w, coordinator, holds=True) for w in (0, 1)]
    outs = [p.communicate(timeout=180) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-2000:] for o in outs]
    assert [_result(o) for o in outs] == [[8, 0, 2], [8, 1, 2]]


def test_a_process_without_the_chips_sees_its_own_devices_only() -> None:
    proc = _run(1, f"127.0.0.1:{free_ports(1)[0]}", holds=False)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-2000:]
    assert _result((out, err)) == [4, 0, 1]
