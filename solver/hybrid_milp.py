"""The hybrid execution model as a MILP: the phase model VarioPath's ``phased`` plan lives in,
with the assignment of exclusive entries to phases optimised instead of coloured greedily
(issue 31; solver/phases.py; research/hybrid-prototype.md).

The model (continuous time, per network model):

- a *column* is a pair's bytes on one of its candidate routes (``route_columns``: up to four
  per pair, host staging included where the path model offers it as a route);
- a link is *exclusive* when its class does not share paced flows losslessly
  (``NetworkModel.paced_lossless``: the staged root-complex class, ``root_dma``, under ``pcie``
  and ``pcie-fair``); a column crossing one is an *entry*, every other column is *free*;
- there are K phases of free durations t_k (µs). An entry runs in at most one phase, and every
  exclusive link carries at most one entry per phase (time division, paper §3's rule on that
  subset of U); a free column may carry bytes in every phase (paced multipath sharing);
- in phase k: an entry's bytes y over its route rate plus its gap g = o + L + σ (the signal that
  starts the next phase, per message) fit in t_k; a free column's bytes at most bw · t_k; every
  link's bytes of the phase at most C_l (t_k − G_lk), G_lk the largest gap of the phase's
  entries crossing it (the gap is kept free on their links);
- every pair's bytes add up to its demand; minimise λ + Σ_k t_k.

With the assignment fixed this is exactly ``phased``'s LP, so ``phased`` (the greedy colouring)
is a feasible point and the warm start; the MILP searches every assignment with at most K phases
(K: the greedy colouring's count plus ``extra_phases``). Phases are interchangeable, so
t_0 ≥ t_1 ≥ … breaks the symmetry. Solutions are emitted by the planner's own phase emitter
(``phases._emit_phases``), i.e. as the schedule VarioPath would run for that assignment, and
simulated by the caller. The model charges o, L and σ where a phase ends on a signal; a sender's
serialised posts of free pieces and the first post and last latency are not in λ + Σ t_k, so the
simulated time is a little above the model time (``HybridResult.sim_s``; the gap study reports
the simulated time).

Solved by SCIP through OR-Tools (``pywraplp``), single-threaded, relative gap 0. Two valid
additions make the proof cheap (issue 31): per exclusive link, Σ over its entries and the phases
of (y/bw + g·z) ≤ Σ_k t_k (time division summed over the phases), and a bound for every number
of phases, ``_divided_bound`` (the phases merged into one horizon, each entry's use binary, its
gap charged on the links it time-divides), entered as a row Σ t_k ≥ bound. Primal heuristics
look for an assignment meeting that bound (``_colour_used``, then SCIP restricted to the entries
the bound's relaxation uses). "OPTIMAL" only when SCIP proved it or the schedule's model time
meets the any-K bound (then it is optimal whatever the number of phases); ``bound_s`` is the
larger of SCIP's proven bound and the any-K bound (λ + bound on Σ t_k).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from ortools.linear_solver import pywraplp

from variopath_jax.schedule import Schedule
from variopath_jax.sim.network import LINK_CLASSES, NetworkModel, link_classes
from variopath_jax.solver import phases
from variopath_jax.solver.channels import SolverError
from variopath_jax.solver.phases import Columns, route_columns, whole_bytes
from variopath_jax.topology import PathModel, Topology

USED_MB = 1e-6  # an entry carrying at most this (MB) in the any-K relaxation counts as unused
RESTRICTED_SHARE = 0.25  # of the time left, for the heuristic restricted to those entries
DIVIDED_SHARE = 0.25  # of the time limit, for the time-divided any-K bound (``_divided_bound``)
MB = 1e6  # bytes per model unit; time in µs, so a rate of C GB/s is C·1e-3 MB/µs
_STATUS = {
    pywraplp.Solver.OPTIMAL: "OPTIMAL",
    pywraplp.Solver.FEASIBLE: "FEASIBLE",
    pywraplp.Solver.INFEASIBLE: "INFEASIBLE",
    pywraplp.Solver.UNBOUNDED: "UNBOUNDED",
    pywraplp.Solver.ABNORMAL: "ABNORMAL",
    pywraplp.Solver.NOT_SOLVED: "NOT_SOLVED",
}


def exclusive_links(topo: Topology, network: NetworkModel) -> np.ndarray:
    """Per directed link: is it time-divided under ``network`` (its class does not share paced
    flows losslessly). ``link_classes`` files both root classes as ``root_p2p``: such a link is
    exclusive when either root class is."""
    cls = link_classes(topo)
    out = np.zeros(len(cls), dtype=bool)
    for index, name in enumerate(LINK_CLASSES):
        if name == "root_dma":
            continue
        lossless = network.paced_lossless(name)
        if name == "root_p2p":
            lossless = lossless and network.paced_lossless("root_dma")
        if not lossless:
            out |= cls == index
    return out


def colour_entries(col: Columns, topo: Topology, exclusive: np.ndarray) -> phases.Phases:
    """The entries (columns crossing an exclusive link) coloured into phases: the planner's own
    greedy colouring (``phases.colour``) where the exclusive links are the root-complex links,
    else first fit in column order on the exclusive links."""
    if np.array_equal(exclusive, phases.root_links(topo)):
        return phases.colour(col, topo)
    incidence = col.links.tocsc()
    entries, hits, phase, taken = [], [], [], []
    for c in range(col.size):
        lids = incidence.indices[incidence.indptr[c] : incidence.indptr[c + 1]]
        hit = frozenset(int(lid) for lid in lids if exclusive[lid])
        if not hit:
            continue
        k = next((k for k, used in enumerate(taken) if not used & hit), len(taken))
        if k == len(taken):
            taken.append(set())
        taken[k] |= hit
        entries.append(c)
        hits.append(hit)
        phase.append(k)
    return phases.Phases(
        np.array(entries, dtype=np.int64), np.array(phase, dtype=np.int64), len(taken), hits
    )


@dataclass
class HybridResult:
    """The hybrid model's best schedule and proven bound (seconds)."""

    status: str  # OPTIMAL only when proven; FEASIBLE: a schedule without proof
    time_s: float  # the model time λ + Σ t_k of the best assignment found
    bound_s: float  # proven lower bound on the model time of every assignment with ≤ K phases
    warm_s: float  # the model time of the warm start (the greedy colouring: ``phased``'s LP)
    phases: int  # K
    entries: int  # columns crossing an exclusive link
    schedule: Schedule | None  # the best assignment, emitted as the planner emits ``phased``
    seconds: float
    assignment: dict[int, int]  # entry column -> its phase (entries used)
    any_k_bound_s: float = 0.0  # bound on every assignment, whatever its number of phases

    @property
    def any_k(self) -> bool:
        """The best found meets the bound for every K: optimal whatever the number of phases."""
        return self.time_s <= self.any_k_bound_s * (1 + 1e-9)


@dataclass
class _Model:
    """The built MILP: its solver and variables (bytes in MB, time in µs)."""

    solver: pywraplp.Solver
    t: list
    x: dict  # (free column, phase) -> var
    y: dict  # (entry column, phase) -> var
    z: dict  # (entry column, phase) -> var
    order: list  # the symmetry-breaking rows t_k >= t_{k+1}


def _gap_us(col: Columns, entries: np.ndarray, topo: Topology, network: NetworkModel) -> np.ndarray:
    """Per entry column, its gap o + L + σ in µs (phases._gaps, per column)."""
    ph = phases.Phases(entries, np.zeros(len(entries), dtype=np.int64), 1, [])
    return phases._gaps(col, ph, topo, network) * 1e-3


def _build(
    col: Columns, topo: Topology, exclusive: np.ndarray, gap: dict[int, float], K: int
) -> _Model:
    """The model of the module docstring with K phases; ``gap`` maps each entry column to its
    o + L + σ (µs); the symmetry rows are built disabled (the warm start's LP runs first)."""
    solver = pywraplp.Solver.CreateSolver("SCIP")
    if solver is None:
        raise SolverError("OR-Tools was built without SCIP")
    inf = solver.infinity()
    cap = np.array([lk.gbs for lk in topo.graph.links]) * 1e-3  # MB/µs
    inc = col.links.tocsc()
    links_of = [inc.indices[inc.indptr[c] : inc.indptr[c + 1]] for c in range(col.size)]
    slowest = np.array([cap[lids].min() for lids in links_of])
    rate = col.rate * 1e-3
    volume = col.volume / MB
    t = [solver.NumVar(0.0, inf, f"t{k}") for k in range(K)]
    x, y, z = {}, {}, {}
    per_pair: list[list] = [[] for _ in col.pairs]
    per_link: dict[tuple[int, int], list] = {}
    entry_links: dict[tuple[int, int], list[int]] = {}  # (link, phase) -> entries crossing it
    for c in range(col.size):
        p = col.pair_of[c]
        is_entry = c in gap
        for k in range(K):
            if is_entry:
                v = y[c, k] = solver.NumVar(0.0, float(volume[p]), f"y{c}_{k}")
                b = z[c, k] = solver.BoolVar(f"z{c}_{k}")
                solver.Add(v <= float(volume[p]) * b)
                solver.Add(v * (1.0 / rate[c]) + gap[c] * b <= t[k])
            else:
                v = x[c, k] = solver.NumVar(0.0, float(volume[p]), f"x{c}_{k}")
                if rate[c] < slowest[c] * (1 - 1e-9):
                    solver.Add(v <= rate[c] * t[k])
            per_pair[p].append(v)
            for lid in links_of[c]:
                per_link.setdefault((int(lid), k), []).append(v)
                if is_entry and not exclusive[lid]:
                    entry_links.setdefault((int(lid), k), []).append(c)
        if is_entry:
            solver.Add(sum(z[c, k] for k in range(K)) <= 1)
    for p, vs in enumerate(per_pair):
        solver.Add(sum(vs) == float(volume[p]))
    for (lid, k), vs in per_link.items():
        if exclusive[lid]:
            # one entry at a time; its bytes fit the link by its own gap row (bw ≤ C)
            solver.Add(
                sum(z[c, k] for c in range(col.size) if (c, k) in z and lid in links_of[c]) <= 1
            )
            continue
        crossing = entry_links.get((lid, k), [])
        if crossing:
            held = solver.NumVar(0.0, inf, f"g{lid}_{k}")
            for c in crossing:
                solver.Add(held >= gap[c] * z[c, k])
            solver.Add(sum(vs) + cap[lid] * held <= cap[lid] * t[k])
        else:
            solver.Add(sum(vs) <= cap[lid] * t[k])
    # time division per exclusive link, summed over the phases: its entries run one per phase,
    # each within its phase's t_k, so Σ_c Σ_k (y/bw + g·z) ≤ Σ_k t_k (valid; the per-phase rows
    # above only make each entry fit, which the LP relaxation satisfies with fractional z)
    for lid in np.flatnonzero(exclusive):
        on = [c for c in gap if lid in links_of[c]]
        if on:
            solver.Add(
                sum(y[c, k] * (1.0 / rate[c]) + gap[c] * z[c, k] for c in on for k in range(K))
                <= sum(t)
            )
    order = [solver.Add(t[k] - t[k + 1] >= -inf) for k in range(K - 1)]
    solver.Minimize(sum(t))
    return _Model(solver, t, x, y, z, order)


def entry_gaps(
    col: Columns, greedy: phases.Phases, topo: Topology, network: NetworkModel
) -> dict[int, float]:
    """Per root entry of ``greedy`` (its column), its gap o + L + σ (µs)."""
    return dict(
        zip(
            (int(c) for c in greedy.entry),
            _gap_us(col, greedy.entry, topo, network).tolist(),
            strict=True,
        )
    )


def solve_hybrid(
    demand: np.ndarray,
    model: PathModel,
    network: NetworkModel,
    *,
    lambda_s: float | None = None,
    extra_phases: int = 0,
    time_limit_s: float = 60.0,
) -> HybridResult:
    """The hybrid model's optimum (module docstring) over every assignment with at most
    K = (greedy colouring's phases) + ``extra_phases`` phases, warm-started from the greedy
    colouring (``phased``'s plan); SCIP with ``time_limit_s``."""
    start = time.perf_counter()
    topo = model.topology
    lam = network.barrier_s if lambda_s is None else lambda_s
    col = route_columns(model, demand)
    exclusive = exclusive_links(topo, network)
    if not col.size:
        return HybridResult("OPTIMAL", lam, lam, lam, 0, 0, None, 0.0, {})
    greedy = colour_entries(col, topo, exclusive)
    gap = entry_gaps(col, greedy, topo, network)
    K = max(greedy.count, 1) + max(extra_phases, 0)
    paced = _merged_bound(col, topo)
    divided = _divided_bound(col, topo, exclusive, gap, time_limit_s * DIVIDED_SHARE)
    floor = max(paced, divided.bound)  # µs, proven for every K
    any_k = lam + floor * 1e-6
    m = _build(col, topo, exclusive, gap, K)
    solver = m.solver
    solver.SetNumThreads(1)
    # the warm start: the greedy colouring fixed, no symmetry rows (an LP: phased's)
    fixed = _fixed(m, K, {int(c): int(k) for c, k in zip(greedy.entry, greedy.phase, strict=True)})
    if fixed is None:
        raise SolverError("the hybrid model's warm start (phased's LP) did not solve")
    warm, best = fixed
    if not m.z:  # nothing exclusive: the LP is the model, solved to optimality
        schedule = _emit(model, col, network, m, {}, K, lam, lambda v: best[v.index()])
        seconds = time.perf_counter() - start
        return HybridResult(
            "OPTIMAL",
            lam + warm * 1e-6,
            lam + warm * 1e-6,
            lam + warm * 1e-6,
            K,
            0,
            schedule,
            seconds,
            {},
            min(any_k, lam + warm * 1e-6),
        )
    # the proven any-K bound as a row: SCIP's own bound starts there, and an assignment that
    # meets it ends the search
    solver.Add(sum(m.t) >= floor)
    value, status, bound = warm, "FEASIBLE", 0.0
    # primal heuristic 1: the entries the any-K bound's relaxation uses, coloured first fit by
    # decreasing duration (the longest entries of disjoint exclusive links share a phase), the
    # phase LP solved for that assignment
    if divided.value is not None:
        used = _colour_used(col, exclusive, gap, divided.value, K)
        if used is not None:
            fixed = _fixed(m, K, used)
            if fixed is not None and fixed[0] < value:
                value, best = fixed
    params = pywraplp.MPSolverParameters()
    params.SetDoubleParam(params.RELATIVE_MIP_GAP, 0.0)
    for row in m.order:
        row.SetLb(0.0)

    def attempt(hint: dict[int, float], seconds: float) -> tuple[int, float]:
        """One SCIP solve from ``hint``; keeps its solution when better than the best so far.
        Returns SCIP's code and its proven bound (0 when it has none)."""
        nonlocal best, value
        variables = solver.variables()
        solver.SetHint([variables[i] for i in hint], list(hint.values()))
        solver.SetTimeLimit(max(1, int(seconds * 1000)))
        code = solver.Solve(params)
        if code not in (pywraplp.Solver.OPTIMAL, pywraplp.Solver.FEASIBLE):
            return code, 0.0
        found = solver.Objective().Value()
        if found < value:
            value = found
            best = {v.index(): v.solution_value() for v in variables}
        proven = solver.Objective().Value() if code == pywraplp.Solver.OPTIMAL else None
        return code, proven if proven is not None else solver.Objective().BestBound()

    # primal heuristic 2: SCIP on the assignments restricted to the entries the any-K bound's
    # relaxation uses (the others fixed unused); a schedule meeting the bound is optimal for
    # every K
    if divided.value is not None and value > floor * (1 + 1e-9):
        unused = [c for c in gap if divided.value[c] <= USED_MB]
        for c in unused:
            for k in range(K):
                m.z[c, k].SetBounds(0.0, 0.0)
        for c in gap:
            if c not in unused:
                for k in range(K):
                    m.z[c, k].SetBounds(0.0, 1.0)
        left = time_limit_s - (time.perf_counter() - start)
        attempt(best, left * RESTRICTED_SHARE)
    for v in m.z.values():
        v.SetBounds(0.0, 1.0)
    if value > floor * (1 + 1e-9):
        left = time_limit_s - (time.perf_counter() - start)
        code, bound = attempt(best, left)
        if code == pywraplp.Solver.OPTIMAL and value <= bound * (1 + 1e-9):
            status = "OPTIMAL"  # SCIP proved the optimum of the K-phase model

    def value_of(v: pywraplp.Variable) -> float:
        return best[v.index()]

    if value <= floor * (1 + 1e-9):  # meets a bound proven for every K: optimal, and for any K
        status = "OPTIMAL"
    bound = max(0.0, min(max(bound, floor), value))
    assignment = {c: k for (c, k), v in m.z.items() if value_of(v) > 0.5}
    schedule = _emit(model, col, network, m, assignment, K, lam, value_of)
    return HybridResult(
        status,
        lam + value * 1e-6,
        lam + bound * 1e-6,
        lam + warm * 1e-6,
        K,
        len(gap),
        schedule,
        time.perf_counter() - start,
        assignment,
        min(any_k, lam + value * 1e-6),
    )


def _fixed(m: _Model, K: int, phase_of: dict[int, int]) -> tuple[float, dict[int, float]] | None:
    """The phase LP for one assignment (entry column -> phase; entries not in it unused), without
    the symmetry rows: its Σ t_k (µs) and its solution as a hint (variable index -> value) with
    the phases renumbered by decreasing t_k, so that it meets the symmetry rows. None when the
    LP has no optimum."""
    for (c, k), v in m.z.items():
        v.SetBounds(float(phase_of.get(c) == k), float(phase_of.get(c) == k))
    for row in m.order:
        row.SetLb(-m.solver.infinity())
    if m.solver.Solve() != pywraplp.Solver.OPTIMAL:
        return None
    rank = np.argsort([-v.solution_value() for v in m.t], kind="stable")
    hint = {}
    for new, old in enumerate(rank):
        hint[m.t[new].index()] = m.t[old].solution_value()
        for table in (m.x, m.y, m.z):
            for (c, k), v in table.items():
                if k == old:
                    hint[table[c, new].index()] = v.solution_value()
    return m.solver.Objective().Value(), hint


def _colour_used(
    col: Columns, exclusive: np.ndarray, gap: dict[int, float], value: np.ndarray, K: int
) -> dict[int, int] | None:
    """The entries carrying bytes in ``value`` (the any-K relaxation's split, MB per column)
    coloured first fit by decreasing duration bytes/bw + gap into phases with one entry per
    exclusive link; None when that needs more than K phases."""
    inc = col.links.tocsc()
    rate = col.rate * 1e-3
    used = [c for c in gap if value[c] > USED_MB]
    used.sort(key=lambda c: (-(value[c] / rate[c] + gap[c]), c))
    taken: list[set[int]] = []
    phase_of = {}
    for c in used:
        hit = {int(lid) for lid in inc.indices[inc.indptr[c] : inc.indptr[c + 1]] if exclusive[lid]}
        k = next((k for k, links in enumerate(taken) if not links & hit), len(taken))
        if k == len(taken):
            taken.append(set())
        taken[k] |= hit
        phase_of[c] = k
    return phase_of if len(taken) <= K else None


def _merged_bound(col: Columns, topo: Topology) -> float:
    """Σ t_k bounded for any K (µs): the model with every phase merged into one and nothing
    exclusive (the paced LP). Summing a K-phase solution's pieces per column is feasible there:
    link rows and rate caps add up, an entry's y ≤ bw·t_k, gaps only take capacity away."""
    m = _build(col, topo, np.zeros(len(topo.graph.links), dtype=bool), {}, 1)
    if m.solver.Solve() != pywraplp.Solver.OPTIMAL:
        return 0.0
    return m.solver.Objective().Value()


@dataclass
class _Divided:
    """The time-divided merged bound (``_divided_bound``): Σ t_k bounded for any K (µs), with
    SCIP's status and the relaxation's best split (per column, MB)."""

    bound: float  # proven: SCIP's dual bound (its optimum when proven)
    proven: bool
    value: np.ndarray | None  # per column, bytes (MB) of the relaxation's best solution


def _divided_bound(
    col: Columns, topo: Topology, exclusive: np.ndarray, gap: dict[int, float], time_limit_s: float
) -> _Divided:
    """Σ t_k bounded for any number of phases (µs), tighter than the paced LP: every phase merged
    into one horizon T = Σ_k t_k, keeping what time division costs. Per column its total bytes v,
    per entry a binary u (used). It is a relaxation of the K-phase model for every K: from a
    K-phase solution take v_c = Σ_k pieces, u_c = Σ_k z_ck, T = Σ_k t_k; then

    - an entry's v/bw + g·u ≤ T (it runs in one phase, within t_k), v ≤ D·u;
    - an exclusive link's entries run one per phase, each within its phase, so
      Σ_{c on it} (v_c/bw_c + g_c·u_c) ≤ T (free columns never cross an exclusive link);
    - a shared link's bytes add up over the phases: Σ v ≤ C·T, and ≤ C·(T − Σ_c g_c·u_c) over
      the entries c crossing it and any one exclusive link (they run in distinct phases, and
      each holds its gap free on the shared link in its own phase);
    - rate caps and pair sums add up.

    With u relaxed to [0, 1] this is the paced LP (the gaps vanish); binary, it charges each
    entry used its gap on its exclusive links. SCIP, single thread, relative gap 0; the bound is
    SCIP's dual bound, valid when out of time too."""
    solver = pywraplp.Solver.CreateSolver("SCIP")
    if solver is None:
        raise SolverError("OR-Tools was built without SCIP")
    solver.SetNumThreads(1)
    inf = solver.infinity()
    cap = np.array([lk.gbs for lk in topo.graph.links]) * 1e-3  # MB/µs
    inc = col.links.tocsc()
    links_of = [inc.indices[inc.indptr[c] : inc.indptr[c + 1]] for c in range(col.size)]
    rate = col.rate * 1e-3
    volume = col.volume / MB
    T = solver.NumVar(0.0, inf, "T")
    v = [solver.NumVar(0.0, float(volume[col.pair_of[c]]), f"v{c}") for c in range(col.size)]
    u = {c: solver.BoolVar(f"u{c}") for c in gap}
    per_pair: list[list] = [[] for _ in col.pairs]
    per_link: dict[int, list[int]] = {}
    for c in range(col.size):
        per_pair[col.pair_of[c]].append(v[c])
        for lid in links_of[c]:
            per_link.setdefault(int(lid), []).append(c)
        if c in gap:
            solver.Add(v[c] <= float(volume[col.pair_of[c]]) * u[c])
            solver.Add(v[c] * (1.0 / rate[c]) + gap[c] * u[c] <= T)
        elif rate[c] < cap[links_of[c]].min() * (1 - 1e-9):
            solver.Add(v[c] <= rate[c] * T)
    for p, vs in enumerate(per_pair):
        solver.Add(sum(vs) == float(volume[p]))
    for lid, cs in per_link.items():
        if exclusive[lid]:
            solver.Add(sum(v[c] * (1.0 / rate[c]) + gap[c] * u[c] for c in cs) <= T)
            continue
        load = sum(v[c] for c in cs)
        solver.Add(load <= cap[lid] * T)
        # the entries crossing this link and one exclusive link run in distinct phases, each
        # holding its gap on this link in its own phase: their gaps add up
        for ex in sorted({int(e) for c in cs if c in gap for e in links_of[c] if exclusive[e]}):
            held = [c for c in cs if c in gap and ex in links_of[c]]
            solver.Add(load + cap[lid] * sum(gap[c] * u[c] for c in held) <= cap[lid] * T)
    solver.Minimize(T)
    solver.SetTimeLimit(max(1, int(time_limit_s * 1000)))
    params = pywraplp.MPSolverParameters()
    params.SetDoubleParam(params.RELATIVE_MIP_GAP, 0.0)
    code = solver.Solve(params)
    if code not in (pywraplp.Solver.OPTIMAL, pywraplp.Solver.FEASIBLE):
        return _Divided(0.0, False, None)
    proven = code == pywraplp.Solver.OPTIMAL
    bound = solver.Objective().BestBound()  # its dual bound, whether proven or out of time
    value = np.array([x.solution_value() for x in v])
    return _Divided(max(0.0, bound), proven, value)


def _emit(
    model: PathModel,
    col: Columns,
    network: NetworkModel,
    m: _Model,
    assignment: dict[int, int],
    K: int,
    lam: float,
    value_of: Callable[[pywraplp.Variable], float],
) -> Schedule:
    """The solution as the planner's phase emitter writes ``phased``: entries used, each in its
    phase; free columns' pieces per phase; whole bytes pair by pair."""
    topo = model.topology
    exclusive = exclusive_links(topo, network)
    inc = col.links.tocsc()
    entries = np.array(sorted(assignment), dtype=np.int64)
    root_of = [
        frozenset(
            int(lid) for lid in inc.indices[inc.indptr[c] : inc.indptr[c + 1]] if exclusive[lid]
        )
        for c in entries
    ]
    ph = phases.Phases(
        entries, np.array([assignment[int(c)] for c in entries], dtype=np.int64), K, root_of
    )
    free = sorted({c for c, _ in m.x})
    piece_col = np.array([c for k in range(K) for c in free] + list(entries), dtype=np.int64)
    piece_phase = np.array([k for k in range(K) for _ in free] + list(ph.phase), dtype=np.int64)
    value = np.array(
        [value_of(m.x[c, k]) for k in range(K) for c in free]
        + [value_of(m.y[int(c), assignment[int(c)]]) for c in entries]
    )
    value = np.maximum(value, 0.0) * MB
    pair_of = np.asarray(col.pair_of)
    order = np.argsort(pair_of[piece_col], kind="stable")
    nbytes = np.empty(len(piece_col), dtype=np.int64)
    nbytes[order] = whole_bytes(value[order], list(pair_of[piece_col][order]), col.volume)
    gap = phases._gaps(col, ph, topo, network)
    schedule = phases._emit_phases(model, col, ph, K, piece_col, piece_phase, nbytes, gap, lam)
    schedule.meta.update({"scheduler": "hybrid-milp", "hybrid": "milp"})
    return schedule
