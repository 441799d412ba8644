"""The physical lower bound: no schedule on a topology finishes an AlltoAllv faster (DESIGN.md
"Lower bound").

TE-CCL (Liu et al., SIGCOMM'24, research/peer-systems.md §4) writes AlltoAll as a multi-commodity
flow over time-expanded epochs, commodities keyed by source (exact for AlltoAll: one source's flow
to many sinks splits into paths). Our fluid model has no store-and-forward delay on links or
switches, so the time-expanded LP with epochs of length τ is feasible in K epochs exactly when a
static flow routes the demand at rate (K·τ)⁻¹ of it; its optimum is ⌈T*/τ⌉·τ, T* being the
static LP below. We therefore solve the τ → 0 limit directly — no epochs, no discretisation
error (coarse τ costs TE-CCL up to 20%, SyCCL reports) — as one LP per topology and demand:

    minimise   T
    subject to Σ_s f_s(e) ≤ cap(e) · T                  for every directed link e
               out_s(v) − in_s(v) = Σ_d D[s,d]  (v = s), −D[s,v] (v a GPU ≠ s), 0 (otherwise)

Variants: ``relay=True`` lets flow transit GPUs (TE-CCL's store-and-forward at GPUs; a bound on
every schedule, relaying ones included); ``relay=False`` forbids it (a flow entering a GPU other
than its source ends there), comparable to channel schedules, which never relay. The closed-form
``simple`` bound is the largest row or column sum over the GPU's own link rate. ``best`` is the
tightest bound valid for every schedule: max(simple, relay LP).

The LPs are solved with OR-Tools GLOP, bytes in MB and time in ms (GB/s × ms = MB).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from ortools.linear_solver import pywraplp

from variopath_jax import progress
from variopath_jax.solver.channels import SolverError
from variopath_jax.topology import Topology

# Larger LPs take minutes with GLOP; above this many flow variables only ``simple`` is computed.
MAX_LP_VARIABLES = 400_000


@dataclass(frozen=True)
class Bound:
    """Lower bounds on the completion time of one AlltoAllv, in seconds (None: not computed)."""

    simple_s: float
    lp_relay_s: float | None
    lp_direct_s: float | None
    seconds: float

    @property
    def best_s(self) -> float:
        """The tightest bound valid for every schedule (relaying ones included)."""
        return max(self.simple_s, self.lp_relay_s or 0.0)

    def to_dict(self) -> dict:
        return {
            "simple_s": self.simple_s,
            "lp_relay_s": self.lp_relay_s,
            "lp_direct_s": self.lp_direct_s,
            "best_s": self.best_s,
            "seconds": self.seconds,
        }


def simple_bound(demand: np.ndarray, topo: Topology) -> float:
    """max over ranks of (bytes sent / GPU uplink rate, bytes received / GPU downlink rate)."""
    g = topo.graph
    off = np.array(demand, dtype=np.float64)
    np.fill_diagonal(off, 0.0)
    up = np.array([g.links[g.link(v, g.parent[v])].gbs for v in g.gpus]) * 1e9
    down = np.array([g.links[g.link(g.parent[v], v)].gbs for v in g.gpus]) * 1e9
    return float(max((off.sum(axis=1) / up).max(), (off.sum(axis=0) / down).max()))


def flow_lp(demand: np.ndarray, topo: Topology, relay: bool) -> float:
    """The static multi-commodity flow LP (see module); seconds."""
    g = topo.graph
    off = np.array(demand, dtype=np.float64) / 1e6  # MB
    np.fill_diagonal(off, 0.0)
    if not off.any():
        return 0.0
    n_vertices = len(g.vertices)
    gpu_rank = {v: r for r, v in enumerate(g.gpus)}
    sources = [s for s in range(len(off)) if off[s].any()]
    lp = pywraplp.Solver.CreateSolver("GLOP")
    horizon = lp.NumVar(0.0, lp.infinity(), "T")
    flows: dict[int, list] = {}
    for s in sources:
        src_vertex = g.gpus[s]
        row = []
        for lk in g.links:
            # Without relaying, no flow leaves a GPU other than its source.
            blocked = not relay and lk.src in gpu_rank and lk.src != src_vertex
            row.append(None if blocked else lp.NumVar(0.0, lp.infinity(), ""))
        flows[s] = row
    for e, lk in enumerate(g.links):
        terms = [flows[s][e] for s in sources if flows[s][e] is not None]
        if terms:
            lp.Add(sum(terms) <= lk.gbs * horizon)
    out_links: list[list[int]] = [[] for _ in range(n_vertices)]
    in_links: list[list[int]] = [[] for _ in range(n_vertices)]
    for e, lk in enumerate(g.links):
        out_links[lk.src].append(e)
        in_links[lk.dst].append(e)
    for s in sources:
        row = flows[s]
        for v in range(n_vertices):
            out = [row[e] for e in out_links[v] if row[e] is not None]
            inn = [row[e] for e in in_links[v] if row[e] is not None]
            if v == g.gpus[s]:
                supply = off[s].sum()
            elif v in gpu_rank:
                supply = -off[s, gpu_rank[v]]
            else:
                supply = 0.0
            if out or inn or supply:
                lp.Add(sum(out) - sum(inn) == supply)
    lp.Minimize(horizon)
    if lp.Solve() != pywraplp.Solver.OPTIMAL:
        raise SolverError("the flow LP has no solution: some demand has no route in the topology")
    return horizon.solution_value() * 1e-3


def lower_bound(demand: np.ndarray, topo: Topology, *, lp: bool | None = None) -> Bound:
    """Every bound on ``demand``; the LPs unless ``lp`` is False or (``lp`` None and) they would
    exceed ``MAX_LP_VARIABLES`` flow variables. ``lp=True`` past that limit is refused at once,
    naming the endpoint bound that still works."""
    start = time.perf_counter()
    demand = np.asarray(demand)
    if demand.shape != (topo.num_ranks, topo.num_ranks):
        raise SolverError(f"demand is {demand.shape}, the topology has {topo.num_ranks} ranks")
    simple = simple_bound(demand, topo)
    size = topo.num_ranks * len(topo.graph.links)
    if lp and size > MAX_LP_VARIABLES:
        raise SolverError(
            f"the flow LP of {topo.name} x {topo.nodes} would have {size:,} flow variables "
            f"({topo.num_ranks} sources x {len(topo.graph.links)} links), past the solver's limit "
            f"of {MAX_LP_VARIABLES:,} (GLOP takes minutes past it); the endpoint bound "
            "(lp=False: every GPU's bytes over its own link rate) still works at any size"
        )
    if lp is None:
        lp = size <= MAX_LP_VARIABLES
    relay = direct = None
    if lp:
        with progress.task(f"LP lower bound ({size:,} flow variables)", total=2) as task:
            relay = flow_lp(demand, topo, relay=True)
            task.advance()
            direct = flow_lp(demand, topo, relay=False)
            task.advance()
    return Bound(simple, relay, direct, time.perf_counter() - start)
