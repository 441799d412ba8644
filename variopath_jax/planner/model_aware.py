"""VarioPath beyond the paper: the plan the network model predicts fastest.

The paper's Algorithm 2 (``variopath-paper``) executes its activations one after another behind
global barriers, a choice its own §5 calls costly (a ~20 µs barrier; its runtime double-buffers
to hide it). Which execution of a demand is fastest depends on the machine: where links share
well (the ideal model), one all-concurrent step on every pair's paths runs near the flow bound;
where concurrent transfers through a root complex or into a NIC degrade (the calibrated ``pcie``
model), contention-free activations win. ``variopath`` therefore builds several plans from the
same path model and returns the one the configured network model predicts fastest:

- ``barrier``: Algorithm 2's activations, each behind a barrier (the paper's schedule);
- ``signal``: the same activations, signal-driven: each transfer waits only for its sender's and
  receiver's previous activation and for the last activation that crossed each of its links
  (``schedule.signal_driven``), so activations overlap where their ranks and links are free;
- ``concurrent``: every pair at once on its fastest candidate path (one step);
- ``multipath``: every pair at once, its bytes split over its candidate paths in proportion to
  their rates (one step);
- ``staged``: every pair at once, a pair whose fastest path is peer-to-peer through a host bridge
  or root complex (``PHB``, ``NODE``, ``SYS``) bounced through host memory instead, where the
  calibrated model (like the measurements behind it) finds concurrent DMA to memory degrading far
  less than concurrent peer-to-peer forwarded by a root complex (one step).
- ``staged-balanced``: as ``staged``, each pair's bytes split over its equally fast routes;
- ``paced``: every pair at once, its bytes split over its candidate routes by a min-max-load LP
  (the flow LP restricted to the pairs' routes, each route's rate a cap) and every transfer
  *paced* at the rate that ends it together with the others. The caps on every link then add up
  to at most its capacity, so no link is oversubscribed and the plan loses nothing to
  contention under either model. It relies on the transport enforcing the caps (the IR's
  ``Transfer.rate``, docs/simulator.md) and says so: ``meta["paced"]``.
- ``rot-paced``: ``paced`` in R - 1 equal phases so that no uplink into a root port pushes
  writes toward two root complexes at once (the posted-write trigger): each uplink writes to one
  root complex after another, its split solved knowing the phases (:func:`rot_paced`); built
  where a model has the trigger and ``paced`` would set it off.
- ``chained``, ``phased``: the hybrid plans of :mod:`variopath_jax.planner.hybrid`, which keep
  every root-complex link to one flow at a time and pace the rest.

Planning is on every call's critical path, so ``paced``, Algorithm 2's plans, ``chained`` and
``phased``, whose planning can cost more than they save, are built only where they may pay for
it (``planning_pays``, ``phased_pays``); the four concurrent families cost a pass over the demand
and are always built.

The prediction is analytic (:mod:`variopath_jax.planner.predict`, issue 28): the simulator's step
and post semantics with each transfer's data time in closed form, exact for contention-free
activations and for paced steps whose caps fit, a link bound for oversubscribed steps;
``options["predictor"] = "simulate"`` predicts by the fluid simulator itself (the judge, slow).
The paced split is solved online by mirror prox over rank-group pairs
(:mod:`variopath_jax.planner.split`); ``options["split"] = "highs"`` solves the rank-level LP.

**The choice.** Given one model (a profiled machine), ``variopath`` returns that model's fastest
candidate. Given several (the default when the machine is unmeasured: ``pcie`` and
``pcie-fair``, which disagree on whether the posted-write trigger fires), it returns the candidate
of least *regret*: its predicted time over the best candidate's under each model, worst over the
models (minimax regret; ties go to the smaller sum of ratios, then to the earlier candidate).
``schedule.meta`` records every candidate's predicted time under every model
(``predicted_s[model][candidate]``), every candidate's regret and the choice, and the time spent
building (``build_s``) and predicting (``predict_s``) the candidates.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable

import numpy as np
import scipy.optimize
import scipy.sparse

from variopath_jax.catalog import Catalog
from variopath_jax.errors import TopologyError, VarioPathError
from variopath_jax.planner.hybrid import (
    PHASED_LEAST_S,
    chained_work_s,
    hybrid_candidates,
    phased_work_s,
)
from variopath_jax.planner.lp import route_columns, whole_bytes
from variopath_jax.planner.predict import Links, predict
from variopath_jax.planner.split import (
    SPLIT_ITERATIONS,
    aggregate,
    endpoint_bound_s,
    paced_online,
    split_iterations,
)
from variopath_jax.planner.split import (
    rot_paced_online as rot_paced,
)
from variopath_jax.schedule import Schedule, Step, signal_driven
from variopath_jax.schedulers import PlanRequest, transfer
from variopath_jax.sim import FluidSimulator, NetworkModel, model_names
from variopath_jax.topology import PathModel, Topology

MULTIPATH_ROUTES = 4  # the most paths one pair's bytes are split over
ROOT_CLASSES = ("PHB", "NODE", "SYS")  # peer-to-peer forwarded by a host bridge or root complex

# What one activation of Algorithm 2 costs (ffi/planner.cc): binding its lanes to ranks, and
# scoring the catalog's shapes (a factored catalog: every node's). Taken from above of the
# per-activation times ``python benchmarks/bench_planner.py algorithm2`` measured (NativePlanner,
# MoE M = 128 and Zipf 0.6 at 8 MiB and 1 GiB per rank on r5080-bf3 x 1, 2, 4, 8, r5090-bf3 x 1, 2
# and l20-cx7 x 1, 2; this project's shared 2-core machine, three runs on 2026-12-06, which
# swung 1.5x): 3.2 µs per rank at most (l20-cx7 x 1, whose 31,872 cells leave 40 of its 52 µs)
# and 0.37 ns per scored shape cell at most (r5090-bf3 x 2's 38.8 million: 14.4 ms), each with
# 13% of room for a busier machine, as ``hybrid.CHAINED_S_PER_COLUMN_ITERATION`` has: planning is
# on the call's critical path, and the gate takes the side of counting it. The benchmark's run at
# these values (6345c5d, 2026-12-06) measured 0.17-0.98 of the estimate per activation; the
# activations are counted from below (``algorithm2_activations``: N - 1 for a dense demand,
# against N to 2.7 N measured), which leaves the whole call's estimate 0.56-3.4x its cost there.
ALGORITHM2_S_PER_RANK = 3.6e-6
ALGORITHM2_S_PER_SCORED_CELL = 0.42e-9


def scored_cells(catalog: Catalog, topo: Topology) -> int:
    """The shape cells Algorithm 2 scores per activation: the catalog's shapes times their
    cells, once per node for a factored catalog (each node picks its pattern)."""
    shapes = np.shape(catalog.shapes)
    nodes = topo.nodes if catalog.kind == "factored" else 1
    return int(shapes[0] * shapes[1] * shapes[2] * nodes)


@dataclasses.dataclass(frozen=True)
class Algorithm2:
    """Algorithm 2 for one request, run by ``build_candidates`` only where its plans may pay
    for their planning: ``plan`` gives its schedule of the demand, ``cells`` is the catalog's
    ``scored_cells``."""

    plan: Callable[[], Schedule]
    cells: int


def algorithm2_activations(demand: np.ndarray) -> int:
    """A lower bound on Algorithm 2's activations: a channel is a partial permutation (paper
    §3), so a rank sends to, and receives from, one peer per activation at most."""
    nonzero = np.asarray(demand) > 0
    return int(max(nonzero.sum(axis=1).max(initial=0), nonzero.sum(axis=0).max(initial=0)))


def algorithm2_work_s(cells: int, demand: np.ndarray) -> float:
    """The planning Algorithm 2 is expected to cost for ``demand`` (seconds): its activations
    (``algorithm2_activations``) times one activation's cost on a catalog of ``cells`` scored
    cells (``ALGORITHM2_S_PER_RANK``, ``ALGORITHM2_S_PER_SCORED_CELL``)."""
    per_activation = ALGORITHM2_S_PER_RANK * len(demand) + ALGORITHM2_S_PER_SCORED_CELL * cells
    return algorithm2_activations(demand) * per_activation


def planning_slack(
    best_s: list[float], networks: tuple[NetworkModel, ...], bound_s: float
) -> float:
    """The most, over the models, that the best candidate so far (``best_s``, per model) takes
    beyond the least any further plan could take there (λ + o + the data bound ``bound_s`` + the
    shorter latency), s: the planning a further candidate may cost and still pay for itself."""
    return max(
        best - (net.barrier_s + net.issue_s + bound_s + min(net.latency_pcie_s, net.latency_net_s))
        for best, net in zip(best_s, networks, strict=True)
    )


def planning_pays(
    best_s: list[float], networks: tuple[NetworkModel, ...], work_s: float, bound_s: float
) -> bool:
    """Whether planning more candidates (the paced split, Algorithm 2's, ``chained``) may pay
    for itself, planning being on the call's critical path: whether their planning
    (``work_s``) is less than the ``planning_slack``."""
    return planning_slack(best_s, networks, bound_s) > work_s


def phased_pays(req: PlanRequest, best_s: list[float], bound_s: float) -> bool:
    """Whether ``phased`` may pay for its planning (``planning_pays``, against the best
    candidate so far and the data bound ``bound_s``): not where even ``PHASED_LEAST_S`` would
    not (sizing its LP costs milliseconds itself), else against its cost from above
    (``hybrid.phased_work_s``)."""
    return planning_pays(best_s, req.networks, PHASED_LEAST_S, bound_s) and planning_pays(
        best_s, req.networks, phased_work_s(req.model, req.demand), bound_s
    )


def concurrent(
    model: PathModel,
    demand: np.ndarray,
    lambda_s: float,
    paths: int,
    staged: bool = False,
    balanced: bool = False,
) -> Schedule:
    """Every pair at once in one step, on its ``paths`` fastest candidate routes, bytes split in
    proportion to the routes' rates (the last route takes the rounding remainder; one path:
    pairs take equally fast routes in turn; ``balanced``: over the equally fast routes only); with
    ``staged``, a pair whose fastest route crosses a root complex goes through host memory."""
    n = len(demand)
    group_of = model.group_of
    transfers = []
    for i, j in zip(*np.nonzero(demand), strict=True):
        i, j = int(i), int(j)
        a, d = int(group_of[i]), int(group_of[j])
        routes = sorted(model.routes(a, d), key=lambda r: -r.rate)
        if not routes:
            raise TopologyError(f"no path from rank {i} to rank {j}, which have demand")
        fastest = [r for r in routes if r.rate == routes[0].rate]
        if paths == 1:  # equally fast routes (NICs, switch rings) taken in turn by pair
            routes = [fastest[(i + j) % len(fastest)]]
        elif balanced:
            routes = fastest
        routes = routes[:paths]
        if staged and routes[0].cls in ROOT_CLASSES:
            routes = [model.memory_route(a, d)]
        total, left = int(demand[i, j]), int(demand[i, j])
        rate_sum = sum(r.rate for r in routes)
        for k, r in enumerate(routes):
            x = left if k == len(routes) - 1 else int(total * r.rate / rate_sum)
            if x:
                transfers.append(transfer(model, i, j, r, x))
                left -= x
    steps = [Step(tuple(transfers))] if transfers else []
    meta = {"scheduler": "variopath", "activations": len(steps)}
    return Schedule(n, steps, model.topology.fingerprint, lambda_s, "general", meta)


def paced(model: PathModel, demand: np.ndarray, lambda_s: float) -> Schedule:
    """Every pair at once in one step, split over up to ``PACED_ROUTES`` candidate routes by the
    LP  min T  s.t.  Σ_r x_pr = D_p,  Σ_{pr ∋ l} x_pr ≤ C_l T,  x_pr ≤ bw(r) T  (HiGHS), rounded
    to whole bytes, and each transfer paced at x_pr / T' (T' the rounded split's own min-max
    time), so that every transfer ends at T' and no link's caps add up to more than it carries."""
    n = len(demand)
    link_cap = np.array([lk.gbs for lk in model.topology.graph.links])  # GB/s = B/ns
    col = route_columns(model, demand)
    if not col.size:
        return Schedule(n, [], model.topology.fingerprint, lambda_s, "general", _paced_meta(0))
    k, pairs = col.size, col.pairs
    volume = col.volume.astype(np.float64)
    # columns in units of the largest pair, T in units of its time on the fastest link: the
    # coefficients stay near 1 at any volume (HiGHS drops matrix entries under 1e-9)
    scale, fastest = volume.max(), link_cap.max()
    rate = col.rate
    # variables: x (k columns), T; constraints: links, route caps (≤); pairs (=)
    links = col.links
    used = np.flatnonzero(links.getnnz(axis=1))
    a_ub = scipy.sparse.vstack(
        [
            scipy.sparse.hstack([links[used], -link_cap[used, None] / fastest]),
            scipy.sparse.hstack([scipy.sparse.eye(k), -rate[:, None] / fastest]),
        ]
    )
    a_eq = scipy.sparse.hstack(
        [
            scipy.sparse.csr_matrix((np.ones(k), (col.pair_of, range(k))), shape=(len(pairs), k)),
            scipy.sparse.csr_matrix((len(pairs), 1)),
        ]
    )
    cost = np.zeros(k + 1)
    cost[-1] = 1.0
    lp = scipy.optimize.linprog(
        cost,
        A_ub=a_ub.tocsr(),
        b_ub=np.zeros(a_ub.shape[0]),
        A_eq=a_eq.tocsr(),
        b_eq=volume / scale,
        bounds=(0, None),
        method="highs",
    )
    if lp.status != 0:
        raise TopologyError(f"the paced plan's LP failed: {lp.message}")
    split = whole_bytes(lp.x[:k] * scale, col.pair_of, col.volume)
    load = links @ split
    horizon_ns = max(float((load / np.maximum(link_cap, 1e-30)).max()), float((split / rate).max()))
    horizon_ns *= 1 + 1e-6  # caps sum strictly within every capacity after float rounding
    transfers = []
    for (i, j, r), x in zip(col.pieces, split, strict=True):
        if x:
            t = transfer(model, i, j, r, int(x))
            transfers.append(dataclasses.replace(t, rate=min(r.rate, x / horizon_ns)))
    steps = [Step(tuple(transfers))]
    return Schedule(n, steps, model.topology.fingerprint, lambda_s, "general", _paced_meta(1))


def _paced_meta(activations: int) -> dict:
    return {"scheduler": "variopath", "activations": activations, "paced": True}


def robust_choice(predicted: dict[str, dict[str, float]]) -> tuple[str, dict[str, float]]:
    """The candidate of least regret and every candidate's regret, from ``predicted[model]
    [candidate]`` (seconds; every model names the same candidates, in the same order). A
    candidate's regret is its time over the model's best, worst over the models (1 where both
    are 0); ties go to the smaller sum of ratios, then to the earlier candidate. Only candidates
    predicted no slower than ``staged`` (NCCL's own plan) under the first model, the default,
    are chosen (issue 51: the hedge never costs the default machine against NCCL)."""
    models = list(predicted.values())
    names = list(models[0])
    ratios = {name: [] for name in names}
    for times in models:
        best = min(times.values())
        for name in names:
            t = times[name]
            ratios[name].append(t / best if best > 0 else (1.0 if t <= 0 else math.inf))
    regret = {name: max(r) for name, r in ratios.items()}
    order = {name: k for k, name in enumerate(names)}
    default = models[0]
    allowed = [n for n in names if "staged" not in default or default[n] <= default["staged"]]
    choice = min(allowed, key=lambda n: (regret[n], sum(ratios[n]), order[n]))
    return choice, regret


def build_candidates(
    req: PlanRequest,
    algorithm2: Algorithm2 | None,
    hybrid: tuple[str, ...] = ("chained", "phased"),
    known: dict[str, dict[str, float]] | None = None,
) -> dict[str, Schedule]:
    """Every candidate plan of ``variopath`` for the request (module docstring), in the order
    ties are broken by. ``paced`` (its split given as many iterations as may pay for
    themselves: ``split.split_iterations``), Algorithm 2's plans (``algorithm2``; None: no
    candidates, ``NativeChooser.algorithm2_pays``), ``chained`` and ``phased`` are built only
    where they may pay for their planning (``planning_pays``, ``phased_pays``: against the best
    of the candidates built before them and the endpoint bound, or for ``chained``, which runs
    the same routes, the split's bound, and only where the split was solved;
    ``req.options["hybrid"] == "all"`` builds them whatever their planning costs). The paced
    split is solved online (``planner/split.py``) unless ``req.options["split"]`` is
    ``"highs"``; ``hybrid`` names the hybrid plans to build (``("chained",)``: the C++ core's
    own candidates). ``known``, where given, receives the analytic predictions made for the
    gates (``predicted[model][candidate]``), for ``predictions`` not to make them again."""
    model, demand, lam = req.model, req.demand, req.lambda_s
    endpoint_s = endpoint_bound_s(model, demand)
    out = {
        "concurrent": concurrent(model, demand, lam, 1),
        "multipath": concurrent(model, demand, lam, MULTIPATH_ROUTES),
        "staged": concurrent(model, demand, lam, 1, staged=True),
        "staged-balanced": concurrent(
            model, demand, lam, MULTIPATH_ROUTES, staged=True, balanced=True
        ),
    }
    known = {} if known is None else known
    known.update(predictions(out, model.topology, req.networks))

    def best() -> list[float]:
        return [min(times.values()) for times in known.values()]

    every = req.options.get("hybrid") == "all"  # a study of plans

    def pays(work_s: float, bound_s: float) -> bool:
        return every or planning_pays(best(), req.networks, work_s, bound_s)

    def add(plans: dict[str, Schedule]) -> None:
        out.update(plans)
        for name, times in predictions(out, model.topology, req.networks, known=known).items():
            known[name].update(times)

    # the split, as many iterations as may pay for themselves; its bound where it is solved
    # (chained runs the same routes)
    data_bound, paced_frac = None, None
    iterations = (
        SPLIT_ITERATIONS
        if every
        else split_iterations(
            aggregate(model, demand), demand, planning_slack(best(), req.networks, endpoint_s)
        )
    )
    if iterations is not None:
        if req.options.get("split", "online") == "highs":
            paced_plan = paced(model, demand, lam)
            data_bound = endpoint_s
        else:
            paced_plan, paced_frac = paced_online(model, demand, lam, iterations=iterations)
            data_bound = paced_plan.meta["bound_s"]
        add({"paced": paced_plan})
        # its rotation, where a model has the trigger and the paced plan would set it off
        links = Links.of(model.topology)
        if any(links.trigger_factor(net) is not None for net in req.networks):
            rotated = rot_paced(model, demand, lam, paced_frac, data_bound, iterations)
            if rotated is not None:
                add({"rot-paced": rotated})
    if algorithm2 is not None and pays(algorithm2_work_s(algorithm2.cells, demand), endpoint_s):
        paper = algorithm2.plan()
        out = {"barrier": paper, "signal": signal_driven(paper), **out}
        for name, times in predictions(out, model.topology, req.networks, known=known).items():
            known[name].update(times)
    # chained (only where the split was solved), then phased, each where it may pay: safe under
    # `pcie`; chained stops its rates at the split's bound
    if (
        "chained" in hybrid
        and data_bound is not None
        and pays(chained_work_s(model, demand), data_bound)
    ):
        add(hybrid_candidates(req, ("chained",), data_bound))
    if "phased" in hybrid and (every or phased_pays(req, best(), endpoint_s)):
        out |= hybrid_candidates(req, ("phased",))
    return out


def predictions(
    candidates: dict[str, Schedule],
    topo: Topology,
    networks: tuple[NetworkModel, ...],
    predictor: str = "analytic",
    known: dict[str, dict[str, float]] | None = None,
) -> dict[str, dict[str, float]]:
    """``predicted[model][candidate]`` (s): by the analytic predictor (``planner/predict.py``),
    or with ``predictor="simulate"`` by the fluid simulator itself (the judge; slow); the
    analytic predictions in ``known`` are taken as they are."""
    if predictor not in ("analytic", "simulate"):
        raise VarioPathError(f"predictor must be 'analytic' or 'simulate', got {predictor!r}")
    links = Links.of(topo)
    out = {}
    for name, network in zip(model_names(networks), networks, strict=True):
        if predictor == "simulate":
            sim = FluidSimulator(topo, network)
            out[name] = {cand: sim.run(s).completion_s for cand, s in candidates.items()}
        else:
            done = (known or {}).get(name, {})
            out[name] = {
                cand: done[cand] if cand in done else predict(s, links, network)
                for cand, s in candidates.items()
            }
    return out


def plan_model_aware(
    req: PlanRequest, algorithm2: Algorithm2 | None, hybrid: tuple[str, ...] = ("chained", "phased")
) -> Schedule:
    """The candidate plan of least predicted regret over ``req.networks`` (with one model, its
    fastest); ``algorithm2``: Algorithm 2 for the request (None: its plans are no candidates;
    ``build_candidates`` runs it where it may pay); ``hybrid`` the hybrid plans to build.
    ``req.options["predictor"]``: ``"analytic"`` (default) or ``"simulate"``."""
    start = time.perf_counter()
    known: dict[str, dict[str, float]] = {}
    candidates = build_candidates(req, algorithm2, hybrid, known)
    built = time.perf_counter()
    predictor = req.options.get("predictor", "analytic")
    predicted = predictions(candidates, req.model.topology, req.networks, predictor, known)
    choice, regret = robust_choice(predicted)
    schedule = candidates[choice]
    end = time.perf_counter()
    schedule.meta.update(
        {
            "scheduler": "variopath",
            "plan": choice,
            "networks": list(predicted),
            "predicted_s": predicted,
            "predictor": predictor,
            "regret": regret,
            "network": ",".join(predicted),
            "algorithm2_run": "barrier" in candidates,  # run by build_candidates
            "build_s": built - start,  # building the candidates (Algorithm 2 included)
            "predict_s": end - built,  # predicting them
            "plan_s": end - start,
        }
    )
    return schedule
