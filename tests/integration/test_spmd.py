"""Interactive SPMD on a reservation: one persistent JAX process per host, cell after cell.

One v4 2x2x2 reservation (two hosts of 4 chips): JAX sees 2 processes and 8 devices, a psum
crosses hosts, variables persist, a host's exception shows its traceback, an interrupt stops the
cell on every host, and release frees everything.
"""

from __future__ import annotations

import _thread
import threading
import time

import pytest
from IPython import get_ipython
from IPython.testing.globalipapp import start_ipython
from IPython.utils.capture import capture_output

from raytpu_lab.errors import RemoteHostError, ReservationError
from raytpu_lab.lab import Lab

from .conftest import live_actors, live_placement_groups, wait_until

pytestmark = pytest.mark.slow

PSUM = """
import jax.numpy as jnp
local = jnp.full(jax.local_device_count(), jax.process_index() + 1.0)
total = jax.pmap(lambda x: jax.lax.psum(x, "i"), axis_name="i")(local)
float(total[0])
"""


def test_cells_run_on_every_host_in_worker_order_and_keep_their_variables(lab: Lab) -> None:
    res = lab.reserve("2x2x2", "v4", name="spmd", timeout_s=30)
    try:
        first = lab.run_on("spmd", "import jax\n"
                           "(jax.process_index(), jax.process_count(), jax.device_count(), "
                           "jax.local_device_count())")
        assert first.values == [(0, 2, 8, 4), (1, 2, 8, 4)]
        session = lab.slice_session("spmd")
        assert [(h.slice_name, h.worker_id) for h in session.hosts] == \
            [(res.slice_names[0], 0), (res.slice_names[0], 1)]
        # Every host process sits on its own host: the node carrying that worker id's labels.
        snap = lab.snapshot().slice(res.slice_names[0])
        assert [h.node_id for h in session.hosts] == [h.node_id for h in snap.hosts]

        # A psum across both hosts: 4 devices x 1.0 + 4 devices x 2.0.
        assert lab.run_on("spmd", PSUM).values == [12.0, 12.0]

        lab.run_on("spmd", "counter = jax.process_index() * 10")
        again = lab.run_on("spmd", "print('host', counter)\ncounter + 1")
        assert again.values == [1, 11]
        assert [o.stdout for o in again.outputs] == ["host 0\n", "host 10\n"]
        assert again.text().splitlines()[0].startswith("[rank 0 · tpu-v4-2x2x2-")

        # A function runs too (cloudpickled), with its own arguments.
        assert lab.run_on("spmd", lambda k: k * 2, 21).values == [42, 42]

        with pytest.raises(RemoteHostError) as info:
            lab.run_on("spmd", "if jax.process_index() == 1:\n    raise ValueError('boom on 1')\n'ok'")
        err = info.value
        assert err.host.rank == 1 and err.host.worker_id == 1
        assert "ValueError: boom on 1" in err.why and 'File "<cell>", line 2' in err.why
        assert err.result.values == ["ok", None]

        # Interrupt: the kernel's KeyboardInterrupt stops a busy loop on both hosts.
        threading.Timer(3.0, _thread.interrupt_main).start()
        start = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            lab.run_on("spmd", "while True:\n    counter += 0")
        assert time.monotonic() - start < 15
        # The processes were interrupted, not restarted: the variables are still there.
        assert lab.run_on("spmd", "counter").values == [0, 10]
        assert session.started
    finally:
        lab.release("spmd")
    assert wait_until(lambda: not live_placement_groups())
    assert wait_until(lambda: "_HostProcess" not in live_actors(), 10), live_actors()


def test_run_cell_magic_groups_output_per_host(lab: Lab) -> None:
    ip = start_ipython() or get_ipython()  # one global shell per process
    ip.run_line_magic("load_ext", "raytpu_lab")
    lab.reserve("2x2x2", "v4", name="magic-run", timeout_s=30)
    try:
        with capture_output() as out:
            result = ip.run_cell("%%raytpu run --on magic-run --out cell\n"
                                 "print('hello from', jax.process_index())\njax.process_index()",
                                 store_history=False)
        assert result.error_in_exec is None, out.stdout + out.stderr
        assert result.result == [0, 1]
        lines = out.stdout.splitlines()
        assert lines[0].startswith("[rank 0 ·") and lines[1] == "hello from 0"
        assert lines[2].startswith("[rank 1 ·") and lines[3] == "hello from 1"
        assert ip.user_ns["cell"].values == [0, 1]

        with capture_output() as out:
            result = ip.run_cell("%%raytpu run --on nope\n1", store_history=False)
        assert isinstance(result.error_in_exec, ReservationError)
    finally:
        lab.release("magic-run")
    assert wait_until(lambda: "_HostProcess" not in live_actors(), 10), live_actors()
