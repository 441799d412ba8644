"""A self-check of the JAX op on CPU devices against NumPy (``variopath demo`` ends with it)."""

from __future__ import annotations

import time

import numpy as np


def run(devices: int = 8, rows: int = 64, width: int = 16, seed: int = 0) -> dict:
    """Exchange random rows with random counts over ``devices`` CPU devices and compare every
    received row with a NumPy oracle. Needs ``devices`` JAX devices (XLA_FLAGS)."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from variopath_jax.jax_ops import all_to_all_v

    if jax.device_count() < devices:
        return {"ok": False, "error": f"needs {devices} devices, JAX has {jax.device_count()}"}
    mesh = jax.make_mesh(
        (devices,),
        ("ep",),
        axis_types=(jax.sharding.AxisType.Explicit,),
        devices=jax.devices()[:devices],
    )
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, rows // devices + 1, size=(devices, devices)).astype(np.int32)
    x = rng.standard_normal((devices, rows, width)).astype(np.float32)

    def body(xb, cb):
        y, recv = all_to_all_v(xb, cb[0], axis_name="ep", out_capacity=rows * 2)
        return y, recv[None]

    f = jax.jit(
        jax.shard_map(body, mesh=mesh, in_specs=(P("ep"), P("ep")), out_specs=(P("ep"), P("ep")))
    )
    put = lambda a: jax.device_put(a, NamedSharding(mesh, P("ep")))  # noqa: E731
    start = time.perf_counter()
    y, recv = f(put(x.reshape(devices * rows, width)), put(counts))
    y = np.asarray(y).reshape(devices, rows * 2, width)
    seconds = time.perf_counter() - start
    mismatches = 0
    for j in range(devices):
        got = np.concatenate(
            [x[i, counts[i, :j].sum() : counts[i, :j].sum() + counts[i, j]] for i in range(devices)]
        )
        mismatches += int(not np.array_equal(y[j, : len(got)], got)) + int(y[j, len(got) :].any())
    ok = mismatches == 0 and np.array_equal(np.asarray(recv), counts.T)
    return {
        "ok": bool(ok),
        "devices": devices,
        "rows_moved": int(counts.sum()),
        "mismatches": mismatches,
        "seconds": seconds,
    }
