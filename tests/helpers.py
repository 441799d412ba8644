"""Small builders shared by the tests."""

from __future__ import annotations

import socket

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


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for a jax.distributed coordinator)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
