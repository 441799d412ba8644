"""Small builders shared by the tests."""

from __future__ import annotations

import socket

import numpy as np

from variopath_jax.schedule import Schedule, Step, Transfer
from variopath_jax.schedulers import transfer
from variopath_jax.topology import PathModel, Route, Topology
from variopath_jax.topology.presets import NodeBuilder


def route(model: PathModel, i: int, j: int, cls: str) -> Route:
    """The candidate route of class ``cls`` from rank i to rank j."""
    a, d = int(model.group_of[i]), int(model.group_of[j])
    found = [r for r in model.routes(a, d) if r.cls == cls]
    assert found, f"no {cls} route {i}->{j}: {[r.cls for r in model.routes(a, d)]}"
    return found[0]


def lane(model: PathModel, i: int, j: int, cls: str, nbytes: int, carries=None) -> Transfer:
    return transfer(model, i, j, route(model, i, j, cls), nbytes, carries)


def schedule(
    model: PathModel,
    steps: list[list[Transfer]],
    *,
    kind: str = "general",
    lam: float = 0.0,
    deps: list | None = None,
) -> Schedule:
    deps = deps or [None] * len(steps)
    return Schedule(
        model.topology.num_ranks,
        [Step(tuple(ts), d) for ts, d in zip(steps, deps, strict=True)],
        model.topology.fingerprint,
        lam,
        kind,
    )


def tiny4() -> Topology:
    """A 4-GPU case: two switches of 2 GPUs and 1 NIC on one CPU's root ports."""
    b = NodeBuilder()
    b.cpu("cpu0", 0)
    for k in range(2):
        sw = b.switch(f"sw{k}", "cpu0", 64.0)
        b.gpu(sw, 64.0)
        b.gpu(sw, 64.0)
        b.nic(sw, 64.0, 400.0)
    return Topology(b.build(), name="tiny-4")


# Simulated times are sums and products of floats whose order depends on the BLAS kernel and the
# SIMD loops a machine runs (docs/DESIGN.md, "What is bit-exact"): compared with a value stored
# elsewhere or computed by another implementation, they agree to a few units in the last place.
ULPS = 4


def assert_ulps(actual, expected, what: object = "", ulps: int = ULPS) -> None:
    """``actual`` equals ``expected`` (floats, or arrays of them, of the same shape) to within
    ``ulps`` units in the last place of the larger magnitude, element by element."""
    a = np.asarray(actual, dtype=np.float64)
    e = np.asarray(expected, dtype=np.float64)
    assert a.shape == e.shape, f"{what}: shape {a.shape} != {e.shape}"
    gap = np.abs(a - e)
    allowed = ulps * np.spacing(np.maximum(np.abs(a), np.abs(e)))
    bad = np.flatnonzero(~(gap <= allowed))  # NaN fails too
    if bad.size:
        k = int(bad[0])
        raise AssertionError(
            f"{what}: {bad.size} of {a.size} differ by more than {ulps} ulps, first at {k}: "
            f"{a.flat[k]!r} != {e.flat[k]!r}"
        )


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for a jax.distributed coordinator)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
