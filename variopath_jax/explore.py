"""Helpers that open the library up for exploration (the notebooks under ``notebooks/``).

- :func:`shared_links`: the modeled resources (links in U) two or more paths cross;
- :func:`family_routes`, :func:`bind_family` and :func:`unrealizable_shapes`: a catalog family's
  concrete lanes, one channel it instantiates, and the balanced shapes no family realizes (the
  paper's Figure 4);
- :func:`busiest_links`: the modeled links that carried the most in a simulation;
- :func:`trace_plan`: Algorithm 2 over the Python reference planner, one record per iteration
  (the paper's Figure 5), checked to produce the planner's own schedule;
- :func:`executed_schedule`: what the JAX op executed (``configure(debug=True)``,
  ``last_schedule()``) as a schedule the simulator can run.

Plots of all of these are in :mod:`variopath_jax.viz`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from variopath_jax.catalog import Catalog, CatalogError
from variopath_jax.catalog.build import Family
from variopath_jax.planner import ReferencePlanner
from variopath_jax.planner.determinism import SplitMix64
from variopath_jax.planner.reference import quantum
from variopath_jax.schedule import Schedule, Step
from variopath_jax.sim import SimResult
from variopath_jax.topology import PathModel, RankPath, Route, Topology
from variopath_jax.workloads import validate_demand


def endpoint_link(topo: Topology, lid: int) -> bool:
    """Whether a link joins a GPU to its parent: the links outside U (DESIGN.md "Resources U")."""
    g = topo.graph
    lk = g.links[lid]
    return lk.kind == "pcie" and "gpu" in (g.kinds[lk.src], g.kinds[lk.dst])


def shared_links(topo: Topology, paths: Sequence[Sequence[int]]) -> list[int]:
    """Links in U (GPU endpoint links excluded) that two or more of ``paths`` cross, in id
    order."""
    seen: dict[int, int] = {}
    for links in paths:
        for lid in set(links):
            seen[lid] = seen.get(lid, 0) + 1
    return sorted(lid for lid, n in seen.items() if n > 1 and not endpoint_link(topo, lid))


def family_routes(catalog: Catalog, family: Family) -> list[Route]:
    """One concrete route per lane of a flat catalog's family, footprints pairwise disjoint (a NIC
    pool resolved to distinct NICs); first in instance order."""
    if catalog.kind != "flat":
        raise CatalogError("family_routes draws flat catalogs' families")
    items = catalog.instances.instances
    options = [items[index].routes for index, lanes in family for _ in range(lanes)]
    chosen: list[Route] = []
    used: set[int] = set()

    def place(k: int) -> bool:
        if k == len(options):
            return True
        for route in options[k]:
            if used & set(route.links):
                continue
            used.update(route.links)
            chosen.append(route)
            if place(k + 1):
                return True
            chosen.pop()
            used.difference_update(route.links)
        return False

    if not place(0):
        raise CatalogError(
            "the family has no disjoint concrete routes: the catalog is inconsistent"
        )
    return chosen


def bind_family(model: PathModel, routes: Sequence[Route]) -> list[RankPath]:
    """Instantiate a family's lanes (e.g. :func:`family_routes`) as one channel: each lane's
    route between two ranks of its groups, every rank sending once and receiving once, no rank
    to itself; the first such binding in lane and rank order (paper §4.1, "Instantiating a
    channel")."""
    groups = model.groups
    bound: list[tuple[int, int]] = []
    senders: set[int] = set()
    receivers: set[int] = set()

    def place(k: int) -> bool:
        if k == len(routes):
            return True
        r = routes[k]
        for i in groups[r.src_group]:
            if i in senders:
                continue
            for j in groups[r.dst_group]:
                if j == i or j in receivers:
                    continue
                senders.add(i)
                receivers.add(j)
                bound.append((i, j))
                if place(k + 1):
                    return True
                bound.pop()
                senders.discard(i)
                receivers.discard(j)
        return False

    if not place(0):
        raise CatalogError("the lanes admit no one-to-one endpoint binding")
    return [model.path(i, j, r) for (i, j), r in zip(bound, routes, strict=True)]


def busiest_links(result: SimResult, topo: Topology, count: int = 4) -> list[int]:
    """The ``count`` links of U (GPU endpoint links excluded) that carried the most bytes in a
    simulation recorded with ``record_links``, most first."""
    if result.link_load is None:
        raise ValueError("simulate with record_links=True to see link loads")
    intervals, loads = result.link_load
    carried = (loads * (intervals[:, 1] - intervals[:, 0])[:, None]).sum(axis=0)
    order = [int(lid) for lid in np.argsort(-carried, kind="stable") if carried[lid] > 0]
    return [lid for lid in order if not endpoint_link(topo, lid)][:count]


def unrealizable_shapes(catalog: Catalog) -> list[np.ndarray]:
    """The balanced shapes (rows and columns summing to g, paper Eq. 3) a flat catalog lacks:
    those no resource-disjoint family realizes (``variopath catalog verify --verifier cpsat``
    proves it)."""
    from variopath_jax.solver.verify import admissible_shapes

    if catalog.kind != "flat":
        raise CatalogError("unrealizable_shapes lists a flat catalog's shapes")
    known = {s.astype(np.int64).tobytes() for s in catalog.shapes}
    shapes = admissible_shapes(catalog.num_groups, catalog.group_size)
    return [s for s in shapes if s.tobytes() not in known]


@dataclass(frozen=True)
class PlanIteration:
    """One iteration of Algorithm 2 (paper Figure 5).

    Attributes
    ----------
    remaining : np.ndarray
        D_rem before the iteration (N×N bytes).
    aggregated : np.ndarray
        D̂: the remaining demand per ordered rank-group pair (Eq. 5).
    scores : np.ndarray or None
        s(M) = Σ D̂_ad M_ad of every catalog shape (Eq. 6; flat catalogs only).
    shape : np.ndarray
        Lanes per group pair of the chosen activation: M* for a flat catalog, the composed
        node patterns for a factored one, one lane for a fallback.
    candidates : int
        Candidate channels bound and evaluated (the families of M*).
    pairs : list of (i, j)
        The endpoints every lane was bound to (lanes without demand included).
    volumes : list of int
        Bytes each lane carries (Eq. 9).
    rates : list of float
        Each lane's rate bw (GB/s).
    utility : float
        Bytes per second of the activation (Eq. 10).
    fallback : bool
        No candidate served any demand, so the largest entry went alone on its nearest path.
    step : Step
        The activation, as the schedule holds it.
    """

    remaining: np.ndarray
    aggregated: np.ndarray
    scores: np.ndarray | None
    shape: np.ndarray
    candidates: int
    pairs: list[tuple[int, int]]
    volumes: list[int]
    rates: list[float]
    utility: float
    fallback: bool
    step: Step

    @property
    def served(self) -> np.ndarray:
        """The demand this activation serves (N×N bytes)."""
        out = np.zeros_like(self.remaining)
        for (i, j), x in zip(self.pairs, self.volumes, strict=True):
            out[i, j] += x
        return out


def trace_plan(planner: ReferencePlanner, demand: np.ndarray) -> list[PlanIteration]:
    """Run Algorithm 2 on ``demand`` as ``planner.plan`` does, keeping every iteration.

    The iterations' steps are exactly ``planner.plan(demand).steps``: this raises if they are
    not (a planner changed without its trace).
    """
    rem = validate_demand(demand, planner.topo.num_ranks).copy()
    tau, _ = quantum(rem, planner.model, planner.params)
    rng = SplitMix64(planner.params.seed)
    n_groups = planner.n_groups
    flat = planner.catalog.kind == "flat"
    out: list[PlanIteration] = []
    while rem.any():
        dhat = planner._aggregate(rem)
        best, count = None, 0
        for channel in planner._candidates(dhat):
            count += 1
            binding = planner._multistart_aa(channel, rem, tau, rng)
            volumes, utility = planner._evaluate(channel, binding, rem, tau)
            if best is None or utility > best[0]:
                best = (utility, channel, binding, volumes)
        fallback = best is None or best[0] <= 0
        if fallback:
            channel, binding = planner._single_lane(rem)
            volumes, utility = planner._evaluate(channel, binding, rem, tau)
            best = (utility, channel, binding, volumes)
        utility, channel, binding, volumes = best
        shape = np.zeros((n_groups, n_groups), dtype=np.int64)
        for lane in channel:
            shape[lane.src_group, lane.dst_group] += 1
        out.append(
            PlanIteration(
                remaining=rem.copy(),
                aggregated=dhat,
                scores=planner.shapes @ dhat.reshape(-1) if flat else None,
                shape=shape,
                candidates=count,
                pairs=[(int(i), int(j)) for i, j in binding],
                volumes=[int(x) for x in volumes],
                rates=[float(lane.rate) for lane in channel],
                utility=float(utility),
                fallback=fallback,
                step=planner._activation(channel, binding, volumes),
            )
        )
        for (i, j), x in zip(binding, volumes, strict=True):
            rem[i, j] -= x
    if [it.step for it in out] != planner.plan(demand).steps:
        raise RuntimeError("trace_plan no longer follows ReferencePlanner.plan: update the trace")
    return out


def signal_plan_of(log: Mapping[str, object], model: PathModel, params) -> Schedule:
    """The plan the op ran for a ``last_schedule()`` record of the ``"signal"`` execution:
    Algorithm 2's plan of its demand, signal-driven; or, where the op served the call with the
    cached plan of the transposed demand (ffi/layout.cc ``plan_for``: a combine after its
    dispatch), that plan reversed. The one whose steps match the record."""
    from variopath_jax.planner.schedulers import make_planner
    from variopath_jax.schedule import reversed_schedule, signal_driven

    n = model.topology.num_ranks
    demand = np.asarray(log["demand"]).reshape(n, n)
    planner = make_planner(model, params)
    sizes = np.diff(np.asarray(log["step_ptr"])).tolist()
    own = signal_driven(planner.plan(demand))
    if [len(st.transfers) for st in own.steps] == sizes:
        return own
    return reversed_schedule(signal_driven(planner.plan(demand.T.copy())), model.graph)


def executed_schedule(log: Mapping[str, object], planned: Schedule) -> Schedule:
    """The schedule the JAX op executed, for the simulator: ``planned``'s steps and paths with
    the dependencies (``after_ptr``/``after``) and pacing rates (``pace_gbs``) of ``log``, a
    ``last_schedule()`` record. ``planned`` is the op's plan of the same demand (for the default
    signal-driven execution: ``signal_driven`` of the planner's schedule); a step with barrier
    dependencies keeps them. Every logged transfer must be the plan's transfer at the same place
    (same source, destination and bytes), or this raises ``ValueError``."""
    step_ptr = np.asarray(log["step_ptr"])
    src, dst, nbytes = (np.asarray(log[k]) for k in ("src", "dst", "bytes"))
    after_ptr, after, pace = (np.asarray(log[k]) for k in ("after_ptr", "after", "pace_gbs"))
    sizes = [len(st.transfers) for st in planned.steps]
    if np.diff(step_ptr).tolist() != sizes:
        raise ValueError(
            f"the op executed steps of {np.diff(step_ptr).tolist()} transfers, the plan {sizes}"
        )
    where = [(s, k) for s, size in enumerate(sizes) for k in range(size)]
    steps = []
    for s, st in enumerate(planned.steps):
        transfers = []
        for k, t in enumerate(st.transfers):
            f = int(step_ptr[s]) + k
            if (t.src, t.dst, t.nbytes) != (int(src[f]), int(dst[f]), int(nbytes[f])):
                raise ValueError(
                    f"transfer {f}: the op moved {int(nbytes[f])} B {int(src[f])}->{int(dst[f])}, "
                    f"the plan {t.nbytes} B {t.src}->{t.dst}"
                )
            if st.deps == ():
                t = dataclasses.replace(
                    t, after=tuple(where[int(a)] for a in after[after_ptr[f] : after_ptr[f + 1]])
                )
            if pace[f] > 0:
                t = dataclasses.replace(t, rate=float(pace[f]))
            transfers.append(t)
        steps.append(dataclasses.replace(st, transfers=tuple(transfers)))
    return Schedule(
        planned.ranks, steps, planned.fingerprint, planned.lambda_s, planned.kind, planned.meta
    )
