"""The C++ planner core (ffi/planner.cc) behind the same interface as the Python reference."""

from __future__ import annotations

import time

import numpy as np

from variopath_jax.catalog import Catalog, store
from variopath_jax.planner.reference import PlannerParams, PlanStats
from variopath_jax.schedule import Schedule, Step, Transfer
from variopath_jax.topology import PathModel
from variopath_jax.topology.paths import staged_class
from variopath_jax.workloads import validate_demand


def deployment_arrays(catalog: Catalog, model: PathModel) -> dict:
    """What the C++ core needs to know about the deployment besides the catalog."""
    topo, g = model.topology, model.graph
    n = topo.num_ranks
    ups = [model.endpoint_links(i)[0] for i in range(n)]
    downs = [model.endpoint_links(i)[1] for i in range(n)]
    n_groups = len(model.groups)
    near_ptr, near_links, near_rate, near_via = [0], [], [], []
    for a in range(n_groups):
        for d in range(n_groups):
            routes = model.routes(a, d)
            r = model.nearest(a, d) if routes else None
            if r is not None:
                near_links += list(r.links)
            near_rate.append(r.rate if r is not None else 0.0)
            near_via.append(1 if r is None or r.via_endpoints else 0)
            near_ptr.append(len(near_links))
    lpn = g.links_per_node
    return {
        "ranks": n,
        "nodes": topo.nodes,
        "n_groups": n_groups,
        "group_size": catalog.group_size,
        "group_ranks": [r for grp in model.groups for r in grp],
        "group_of": [int(x) for x in model.group_of],
        "endpoint_up": ups,
        "endpoint_down": downs,
        "endpoint_up_gbs": [g.links[lid].gbs for lid in ups],
        "endpoint_down_gbs": [g.links[lid].gbs for lid in downs],
        "links_per_node": lpn,
        "net_links_per_node": (len(g.links) - topo.nodes * lpn) // topo.nodes,
        "near_ptr": near_ptr,
        "near_links": near_links,
        "near_rate": near_rate,
        "near_via": near_via,
    }


class NativePlanner:
    """Algorithm 2 in C++; the same schedule as ``ReferencePlanner`` for the same inputs."""

    def __init__(self, catalog: Catalog, model: PathModel, params: PlannerParams) -> None:
        from variopath_jax._native import Planner

        catalog.check_topology(model.topology, model)
        self.catalog, self.model, self.params = catalog, model, params
        self._core = Planner(
            store.dumps(catalog), catalog.fingerprint, deployment_arrays(catalog, model)
        )
        self._classes = [it.cls for it in catalog.instances.instances]

    def plan(self, demand: np.ndarray) -> Schedule:
        p = self.params
        start = time.perf_counter()
        out = self._core.plan(
            validate_demand(demand, self.model.topology.num_ranks),
            p.lambda_s,
            p.k_target or 0,
            p.starts,
            p.sweeps,
            p.seed,
            p.granularity == "auto",
            p.max_candidates,
        )
        seconds = time.perf_counter() - start
        steps = []
        src, dst, nbytes, rate = out["src"], out["dst"], out["bytes"], out["rate"]
        kind, link_ptr, links = out["lane_kind"], out["link_ptr"], out["links"]
        group_of = self.model.group_of
        step_ptr = out["step_ptr"]
        for s in range(len(step_ptr) - 1):
            transfers = []
            for t in range(step_ptr[s], step_ptr[s + 1]):
                i, j = int(src[t]), int(dst[t])
                if kind[t] >= 0:
                    cls = self._classes[kind[t]]
                elif kind[t] == -1:
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
            len(demand), steps, self.model.topology.fingerprint, p.lambda_s, "channel", meta
        )
