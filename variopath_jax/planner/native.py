"""The C++ planner core (ffi/planner.cc) behind the same interface as the Python reference.

The one typed boundary into C++: :func:`native_deployment` and :func:`native_params` fill the
nanobind-bound ``Deployment`` and ``PlanParams`` structs; ``NativePlanner`` and the JAX op's
configuration (``jax_ops/config.py``) both cross with them and nothing else.
"""

from __future__ import annotations

import time
from dataclasses import fields

import numpy as np

from variopath_jax.catalog import Catalog, store
from variopath_jax.planner.reference import LaneKind, PlannerParams, PlanStats
from variopath_jax.schedule import Schedule, Step, Transfer
from variopath_jax.topology import PathModel
from variopath_jax.topology.paths import staged_class
from variopath_jax.workloads import validate_demand


def _native():
    from variopath_jax import _native

    return _native


def native_params(params: PlannerParams):
    """``PlannerParams`` as the C++ core's ``PlanParams``, field for field."""
    nat = _native()
    out = nat.PlanParams()
    for f in fields(PlannerParams):
        value = getattr(params, f.name)
        if f.name == "k_target":
            value = value or 0
        elif f.name == "granularity":
            value = nat.Granularity.__members__[value.upper()]
        elif f.name == "leaving_price":
            value = nat.LeavingPrice.__members__[value.upper()]
        setattr(out, f.name, value)
    return out


def native_deployment(catalog: Catalog, model: PathModel):
    """What the C++ core needs to know about the deployment besides the catalog."""
    nat = _native()
    topo, g = model.topology, model.graph
    n = topo.num_ranks
    dep = nat.Deployment()
    dep.ranks = n
    dep.n_groups = len(model.groups)
    dep.group_size = catalog.group_size
    dep.group_ranks = [r for grp in model.groups for r in grp]
    dep.group_of = [int(x) for x in model.group_of]
    ups = [model.endpoint_links(i)[0] for i in range(n)]
    downs = [model.endpoint_links(i)[1] for i in range(n)]
    dep.endpoint_up, dep.endpoint_down = ups, downs
    dep.endpoint_up_gbs = [g.links[lid].gbs for lid in ups]
    dep.endpoint_down_gbs = [g.links[lid].gbs for lid in downs]
    layout = nat.LinkLayout()
    layout.nodes = g.layout.nodes
    layout.links_per_node = g.layout.links_per_node
    layout.net_links_per_node = g.layout.net_links_per_node
    dep.layout = layout
    near_ptr, near_links, near_rate, near_via = [0], [], [], []
    for a in range(dep.n_groups):
        for d in range(dep.n_groups):
            r = model.nearest(a, d) if model.routes(a, d) else None
            if r is not None:
                near_links += list(r.links)
            near_rate.append(r.rate if r is not None else 0.0)
            near_via.append(1 if r is None or r.via_endpoints else 0)
            near_ptr.append(len(near_links))
    dep.near_ptr, dep.near_links, dep.near_rate, dep.near_via = (
        near_ptr,
        near_links,
        near_rate,
        near_via,
    )
    return dep


class NativePlanner:
    """Algorithm 2 in C++; the same schedule as ``ReferencePlanner`` for the same inputs."""

    def __init__(self, catalog: Catalog, model: PathModel, params: PlannerParams) -> None:
        catalog.check_topology(model.topology, model)
        self.catalog, self.model, self.params = catalog, model, params
        self._core = _native().Planner(
            store.dumps(catalog), catalog.fingerprint, native_deployment(catalog, model)
        )
        self._params = native_params(params)
        self._classes = [it.cls for it in catalog.instances.instances]

    def plan(self, demand: np.ndarray) -> Schedule:
        checked = validate_demand(demand, self.model.topology.num_ranks)
        start = time.perf_counter()  # the planner's own time: the core's call
        out = self._core.plan(checked, self._params)
        seconds = time.perf_counter() - start
        steps = []
        src, dst, nbytes, rate = out["src"], out["dst"], out["bytes"], out["rate"]
        kind, inst = out["lane_kind"], out["lane_inst"]
        link_ptr, links = out["link_ptr"], out["links"]
        group_of = self.model.group_of
        step_ptr = out["step_ptr"]
        for s in range(len(step_ptr) - 1):
            transfers = []
            for t in range(step_ptr[s], step_ptr[s + 1]):
                i, j = int(src[t]), int(dst[t])
                if kind[t] in (LaneKind.FLAT, LaneKind.INTRA):
                    cls = self._classes[inst[t]]
                elif kind[t] == LaneKind.NET:
                    cls = "NET"
                else:
                    cls = self.model.nearest(int(group_of[i]), int(group_of[j])).cls
                path = tuple(int(x) for x in links[link_ptr[t] : link_ptr[t + 1]])
                staged = staged_class(self.model.topology, cls)
                transfers.append(
                    Transfer(i, j, path, int(nbytes[t]), (i, j), float(rate[t]), cls, staged)
                )
            steps.append(Step(tuple(transfers)))
        self.stats = PlanStats(
            len(steps), seconds, out["tau_s"], out["k"], out["fallbacks"], out["candidates"]
        )
        meta = {
            "scheduler": "variopath",
            "tau_s": out["tau_s"],
            "k": out["k"],
            "activations": len(steps),
            "fallbacks": out["fallbacks"],
            "candidates": out["candidates"],
            "catalog": self.catalog.kind,
        }
        return Schedule(
            len(demand),
            steps,
            self.model.topology.fingerprint,
            self.params.lambda_s,
            "channel",
            meta,
        )
