"""Measure (the first of measure / fit / report): run the experiments the network model needs on
a :class:`~variopath_jax.profile.backend.Backend` and return the raw times, nothing derived
beyond the rate caps the paced experiments were given.

Every rate is measured differentially: the same experiment with each flow carrying ``nbytes``
and half of it, delivered = bytes added ÷ time added, so the fixed per-message costs (o, L)
cancel. Per-message costs are slopes over ``posts`` tiny transfers, so the time of the first one
cancels. The posted-write trigger probe (:mod:`~variopath_jax.profile.trigger`) runs where the
backend knows the node's root complexes (``trigger_topology``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from variopath_jax.profile.backend import Backend, ProfileError, Transfer
from variopath_jax.sim.network import LINK_CLASSES

FLOW_COUNTS = tuple(range(1, 17))
# Rate caps of the paced experiments add up to these fractions of the class's single-flow rate;
# 1.25 is oversubscribed on purpose.
LOADS = (0.5, 0.75, 0.9, 1.0, 1.25)
_ALIGN = 256  # flow sizes are multiples of this many bytes


@dataclass(frozen=True)
class Plan:
    """What to measure: flow counts, loads of the paced experiments, bytes per bandwidth
    experiment (all flows together), the tiny size and count of the per-message probes, and how
    often each experiment repeats (the median is used), and the most situations of the trigger
    probe (0: none)."""

    flow_counts: tuple[int, ...] = FLOW_COUNTS
    loads: tuple[float, ...] = LOADS
    nbytes: int = 64 << 20
    probe_bytes: int = 256
    posts: int = 8
    repeats: int = 1
    trigger_situations: int = 24

    def __post_init__(self) -> None:
        if not self.flow_counts or 1 not in self.flow_counts or min(self.flow_counts) < 1:
            raise ProfileError(f"flow counts {self.flow_counts}: need positive counts including 1")
        if not self.loads or min(self.loads) <= 0:
            raise ProfileError(f"loads {self.loads}: need positive fractions of capacity")
        if self.nbytes < 2 * _ALIGN * max(self.flow_counts):
            raise ProfileError(
                f"nbytes {self.nbytes}: need at least {2 * _ALIGN * max(self.flow_counts)} "
                f"({2 * _ALIGN} per flow at {max(self.flow_counts)} flows)"
            )
        if self.trigger_situations < 0:
            raise ProfileError(f"trigger_situations {self.trigger_situations}: need >= 0")
        if self.probe_bytes < 1 or self.posts < 2 or self.repeats < 1:
            raise ProfileError("probe_bytes >= 1, posts >= 2 and repeats >= 1 are needed")


def _sizes(total: int, k: int) -> list[int]:
    """Per-flow bytes of the two experiments of one differential rate: half, then all."""
    each = total // k // _ALIGN * _ALIGN  # >= 2 * _ALIGN (Plan checks)
    return [each // 2 // _ALIGN * _ALIGN, each]


def _rate_point(backend: Backend, plan: Plan, routes: Sequence[int], cap_bps: float) -> dict:
    """Makespans of k concurrent flows (one step, one per route) at the two sizes."""
    sizes = _sizes(plan.nbytes, len(routes))
    times = [
        [
            float(np.max(backend.run([Transfer(r, size, cap_bps) for r in routes])))
            for _ in range(plan.repeats)
        ]
        for size in sizes
    ]
    return {"nbytes": sizes, "makespan_s": times}


def delivered_bps(point: dict, k: int) -> float:
    """Bytes per second k flows delivered together in one rate point (median makespans)."""
    (b1, b2), (t1, t2) = point["nbytes"], point["makespan_s"]
    dt = float(np.median(t2) - np.median(t1))
    if not dt > 0:
        raise ProfileError(
            f"a rate point's makespan did not grow with its size ({t1} s for {b1} B, {t2} s for "
            f"{b2} B per flow): the measurement is broken or too small"
        )
    return k * (b2 - b1) / dt


def _costs(backend: Backend, plan: Plan, route: int, with_steps: bool) -> dict:
    """Per-message probes on ``route``: the route's rate, one tiny transfer, ``posts`` posts
    waiting for one transfer (o), a chain of signals (σ) and a chain of barrier steps (λ)."""
    b, n = plan.probe_bytes, plan.posts
    out: dict[str, Any] = {
        "route": route,
        "probe_bytes": b,
        "rate": _rate_point(backend, plan, [route], 0.0),
    }

    def ends(transfers: list[Transfer]) -> list[list[float]]:
        return [backend.run(transfers).tolist() for _ in range(plan.repeats)]

    out["single_end_s"] = ends([Transfer(route, b)])
    if with_steps:
        out["issue_ends_s"] = ends([Transfer(route, b)] + [Transfer(route, b, after=0)] * n)
        out["chain_ends_s"] = ends([Transfer(route, b, after=i - 1) for i in range(n + 1)])
        out["barrier_ends_s"] = ends([Transfer(route, b, step=s) for s in range(n + 1)])
    return out


def _trigger(backend: Backend, plan: Plan, say: Callable[[str], None]) -> dict[str, Any]:
    """The trigger probe: per situation the rate point of each of its four experiments."""
    from variopath_jax.profile.trigger import situations

    topo_of = getattr(backend, "trigger_topology", None)
    topo = topo_of() if topo_of is not None else None
    if plan.trigger_situations == 0:
        return {"note": "not measured (trigger_situations 0)", "situations": []}
    if topo is None:
        return {
            "note": f"backend {backend.name} was given no topology: it cannot tell the root "
            "complexes of its GPUs apart (variopath profile --topology)",
            "situations": [],
        }
    found, note = situations(topo, plan.trigger_situations)
    out = []
    for s in found:
        say(f"trigger: uplink {s.uplink} toward {s.roots[0]} and {s.roots[1]}")
        points = {
            name: _rate_point(backend, plan, backend.flow_routes(flows), 0.0)
            for name, flows in s.experiments().items()
        }
        out.append({**s.to_dict(), "points": points})
    return {
        "note": note,
        "topology": topo.name,
        "root_complexes": list(topo.node.root_complexes),
        "situations": out,
    }


def measure(
    backend: Backend, plan: Plan | None = None, progress: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """Every experiment of ``plan`` on ``backend``: the raw document the fit reads."""
    plan = plan or Plan()
    say = progress or (lambda _msg: None)
    raw: dict[str, Any] = {"plan": asdict(plan), "machine": backend.describe()}
    raw["paths"] = {}
    for cls, route in backend.path_routes().items():
        say(f"path class {cls}: single-flow rate")
        raw["paths"][cls] = {"route": route, **_rate_point(backend, plan, [route], 0.0)}
    raw["classes"] = {}
    for cls in LINK_CLASSES:
        if backend.class_routes(cls, 1) is None:
            continue
        say(f"link class {cls}: {len(plan.flow_counts)} flow counts × {len(plan.loads) + 1} loads")
        single = _rate_point(backend, plan, backend.class_routes(cls, 1), 0.0)
        capacity = delivered_bps(single, 1)
        points = []
        for k in plan.flow_counts:
            routes = backend.class_routes(cls, k)
            if routes is None or len(routes) != k:
                raise ProfileError(f"backend {backend.name}: no {k} routes for link class {cls}")
            for load in (None, *plan.loads):
                cap = 0.0 if load is None else load * capacity / k
                points.append(
                    {
                        "k": k,
                        "load": load,
                        "cap_bps": cap,
                        **_rate_point(backend, plan, routes, cap),
                    }
                )
        raw["classes"][cls] = {"capacity_point": single, "points": points}
    raw["costs"] = {}
    for kind in ("pcie", "net"):
        route = backend.latency_route(kind)
        if route is not None:
            say(f"per-message costs over {kind}")
            raw["costs"][kind] = _costs(backend, plan, route, with_steps=kind == "pcie")
    if "pcie" not in raw["costs"]:
        raise ProfileError(f"backend {backend.name}: offers no route to measure o, L, σ and λ on")
    raw["trigger"] = _trigger(backend, plan, say)
    return raw
