"""The paced split solved online (issue 28 item 2; research/online-split.md).

``paced`` splits every pair's bytes over its ``PACED_ROUTES`` fastest candidate routes so that
the most loaded link is least loaded (the flow LP restricted to those routes). Solved with an LP
over every rank pair it cost HiGHS 4 ms – 65 s; here it is solved at rank-group granularity by a
first-order method:

1. **aggregate**: every route of a pair crosses both endpoint GPU links, so their loads are the
   row and column sums of the demand whatever the split, and the ranks of a rank-group pair share
   the same routes: the problem is exact over group pairs, with demand V_ad = Σ D_ij. A group
   pair with one route is a fixed base load.
2. **solve**: mirror prox (entropic on each group pair's simplex of route fractions and on the
   links' weights) on  min_p max_l (base_l + Σ_c V_c p_c [l ∈ c]) / C_l, until the best split
   found is certified within ``SPLIT_TOLERANCE`` of the optimum by the dual bound of a link
   weighting (``lower_bound``), of a cut of the most loaded links (``cut_bound``) or of the
   endpoint bound (no split beats it: ``endpoint_bound_s``), or after at most
   ``SPLIT_ITERATIONS``. Where the cold split (fractions in proportion to the routes' rates) is
   certified already it is kept; otherwise it starts from the deployment's *reference split*, the
   split of the uniform demand solved once per topology (``reference``, ``reference_start``: its
   fractions and link weights), so a call's split depends on its demand and the topology alone
   and most calls are certified in a few iterations or none. A route's cost is its
   links' weights per unit of capacity, the same scale for every pair whatever its volume
   (weighting it by the volume left small pairs unmoved: 5.6% over the LP on l20-cx7 x 2 after
   400 iterations); the answer is the best iterate or mean iterate found (mirror prox's
   guarantee is for the means); optionally warm-started from a previous call's fractions instead
   (the op does not: its plan would then depend on the calls before it).
3. **expand**: a group pair's rank pairs lay their bytes one after another, in row-major order,
   along the group pair's routes in proportion to its fractions (``_route_bounds``), so the links
   beyond the endpoint links see exactly the aggregated load, in whole bytes, and most rank
   pairs take one route;
   the horizon T' is the rounded split's own min-max time, from every pair's rounded bytes, so
   every rank derives the same T' while building only its own transfers (``rank=``: those it
   sends or receives, all a process of the multi-host transport lays out).

The route caps x ≤ bw(r) T of the LP are implied by the link constraints when routes run at
their slowest link's capacity (efficiency 1, no measured rate caps): then the split is within the
solver's tolerance of the LP optimum (tests check 1% against HiGHS). Otherwise the horizon still
takes them into account, but the split does not optimise for them.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from variopath_jax.errors import TopologyError
from variopath_jax.planner.lp import PACED_MIN_BYTES, PACED_ROUTES
from variopath_jax.schedule import Schedule, Step, Transfer
from variopath_jax.sim.network import RootPorts
from variopath_jax.topology import PathModel
from variopath_jax.topology.paths import Route

SPLIT_ITERATIONS = 150  # at most this many mirror prox iterations from a cold start
WARM_ITERATIONS = 30  # from a warm start
SPLIT_STEP = 2.0  # mirror prox step (the saddle function is scaled to about 1)
SPLIT_TOLERANCE = 0.01  # stop once the best split is within 1% of the dual bound
BETTER = 1 - 1e-12  # a split replaces the best one only if this much faster: ties (within float
# rounding, which differs between this reference and the C++ core) keep the earlier
MEAN_CHECK = 10  # every this many iterations, the mean iterate and mean weights are checked too
REFERENCE_ITERATIONS = 1000  # the reference split (uniform demand), once per deployment
REFERENCE_TOLERANCE = 1e-3
START_MIX = 1e-3  # uniform link weight mixed into a start from the reference
SPLIT_S_PER_UNIT = 3e-9  # the C++ core's cost per unit of ``split_work_s`` (bench_planner.py split)
CUT_LINKS = 6  # cut_bound tries every set of up to this many most loaded links,
CUT_SLACK = 0.03  # within this much of the most loaded


@dataclass(frozen=True)
class Aggregate:
    """The split problem at group level (module docstring, step 1).

    ``pairs`` lists the group pairs with demand in row-major order, ``routes`` each pair's
    candidate routes (fastest first); a column is a (pair with a choice, route) and ``col_*``
    describe them: its pair, its volume V, and its links as CSR (``col_ptr``, ``col_links``),
    each with the share of the column's bytes it puts on that link (``col_coef``: 1 here; the
    chained hybrid plan solves the same problem over other resources, ``hybrid.chain_problem``).
    ``cap`` is each resource's capacity (B/s), ``base`` its fixed load (bytes)."""

    pairs: list[tuple[int, int]]
    routes: list[tuple[Route, ...]]
    volume: np.ndarray
    base: np.ndarray
    cap: np.ndarray
    choice: np.ndarray
    col_pair: np.ndarray
    col_ptr: np.ndarray
    col_links: np.ndarray
    col_coef: np.ndarray


def candidate_routes(model: PathModel, a: int, d: int) -> tuple[Route, ...]:
    """A group pair's ``PACED_ROUTES`` fastest routes (stable on ties), as ``paced`` takes them."""
    routes = sorted(model.routes(a, d), key=lambda r: -r.rate)
    if not routes:
        raise TopologyError(f"no path between rank groups {a} and {d}, which have demand")
    return tuple(routes[:PACED_ROUTES])


def aggregate(model: PathModel, demand: np.ndarray) -> Aggregate:
    """Step 1: the group-level problem of ``demand``."""
    group_of = np.asarray(model.group_of)
    g = int(group_of.max()) + 1
    grouped = np.zeros((g, g))
    np.add.at(grouped, (group_of[:, None], group_of[None, :]), demand.astype(np.float64))
    n_links = len(model.topology.graph.links)
    cap = np.array([lk.gbs * 1e9 for lk in model.topology.graph.links])
    base = np.zeros(n_links)
    pairs, routes, choice = [], [], []
    col_pair, col_ptr, col_links = [], [0], []
    for a, d in zip(*np.nonzero(grouped), strict=True):
        a, d = int(a), int(d)
        rs = candidate_routes(model, a, d)
        p = len(pairs)
        pairs.append((a, d))
        routes.append(rs)
        if len(rs) == 1:
            base[list(rs[0].links)] += grouped[a, d]
            continue
        choice.append(p)
        for r in rs:
            col_pair.append(p)
            col_links.extend(r.links)
            col_ptr.append(len(col_links))
    volume = np.array([grouped[a, d] for a, d in pairs])
    return Aggregate(
        pairs,
        routes,
        volume,
        base,
        cap,
        np.array(choice, dtype=np.int64),
        np.array(col_pair, dtype=np.int64),
        np.array(col_ptr, dtype=np.int64),
        np.array(col_links, dtype=np.int64),
        np.ones(len(col_links)),
    )


def initial_fractions(agg: Aggregate) -> np.ndarray:
    """Per column, its pair's fraction in proportion to the routes' rates (a cold start)."""
    rate = np.array([r.rate for p in agg.choice for r in agg.routes[p]], dtype=np.float64)
    total = np.zeros(len(agg.pairs))
    np.add.at(total, agg.col_pair, rate)
    return rate / total[agg.col_pair]


def link_loads(agg: Aggregate, frac: np.ndarray) -> np.ndarray:
    """Per link, its bytes under the column fractions ``frac``."""
    per_col = agg.volume[agg.col_pair] * frac
    load = agg.base.copy()
    np.add.at(load, agg.col_links, np.repeat(per_col, np.diff(agg.col_ptr)) * agg.col_coef)
    return load


def max_time(agg: Aggregate, frac: np.ndarray) -> float:
    """The most loaded link's time (s) under ``frac``, endpoint links excluded."""
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(agg.cap > 0, link_loads(agg, frac) / agg.cap, 0.0)
    return float(t.max(initial=0.0))


def lower_bound(agg: Aggregate, weight: np.ndarray) -> float:
    """A lower bound (s) on every split's ``max_time``: for link weights w summing to 1,
    max_l load_l / C_l ≥ Σ_l w_l load_l / C_l, whose least value over the splits puts each pair's
    volume on its route of least Σ_{l ∈ r} w_l / C_l (LP duality); and no link carries less than
    its fixed load."""
    inv = np.zeros(len(agg.cap))
    np.divide(1.0, agg.cap, out=inv, where=agg.cap > 0)
    per_link = weight * inv
    cost = np.zeros(len(agg.col_pair))
    np.add.at(
        cost,
        np.repeat(np.arange(len(agg.col_pair)), np.diff(agg.col_ptr)),
        per_link[agg.col_links] * agg.col_coef,
    )
    cheapest = np.full(len(agg.pairs), np.inf)
    np.minimum.at(cheapest, agg.col_pair, cost)
    dual = float(per_link @ agg.base) + float(agg.volume[agg.choice] @ cheapest[agg.choice])
    return max(dual, float((agg.base * inv).max(initial=0.0)))


def cut_bound(agg: Aggregate, frac: np.ndarray) -> float:
    """A lower bound (s) on every split's ``max_time``, from the links most loaded under
    ``frac``: for a set T of links, every split puts at least T's fixed load plus, per pair, the
    least any of its routes puts on T onto T's capacity (``lower_bound`` with weights in
    proportion to capacity on T). Tried for every non-empty subset of the ``CUT_LINKS`` most
    loaded links within ``CUT_SLACK`` of the most loaded (ties in link order): where the split
    is near optimal these are the links the optimum saturates, and the bound is often exact
    where the link weights' bound still lags by a few percent."""
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(agg.cap > 0, link_loads(agg, frac) / agg.cap, 0.0)
    top = float(t.max(initial=0.0))
    if top <= 0:
        return 0.0
    key = np.round(t / top, 9)  # times equal but for rounding order by link
    order = np.lexsort((np.arange(len(t)), -key))[:CUT_LINKS]
    links = np.array([lk for lk in order if key[lk] >= 1 - CUT_SLACK and agg.cap[lk] > 0])
    index = np.full(len(agg.cap), -1)
    index[links] = np.arange(len(links))
    entry_col = np.repeat(np.arange(len(agg.col_pair)), np.diff(agg.col_ptr))
    on = index[agg.col_links] >= 0
    crossing = np.zeros((len(agg.col_pair), len(links)))  # per column, its share on each link
    np.add.at(crossing, (entry_col[on], index[agg.col_links[on]]), agg.col_coef[on])
    subsets = (np.arange(1, 1 << len(links))[:, None] >> np.arange(len(links))) & 1
    least = np.full((len(agg.pairs), len(subsets)), np.inf)
    np.minimum.at(least, agg.col_pair, crossing @ subsets.T)
    moved = agg.volume[agg.choice] @ least[agg.choice] if len(agg.choice) else 0.0
    return float(np.max((subsets @ agg.base[links] + moved) / (subsets @ agg.cap[links])))


def _normalise(frac: np.ndarray, col_pair: np.ndarray, pairs: int) -> np.ndarray:
    total = np.zeros(pairs)
    np.add.at(total, col_pair, frac)
    return frac / total[col_pair]


@dataclass(frozen=True)
class Start:
    """Where mirror prox starts: per column its fraction, per link its weight (summing to 1)."""

    frac: np.ndarray
    weight: np.ndarray


@dataclass(frozen=True)
class Split:
    """What mirror prox returns: the column fractions, the mean link weights, and the best lower
    bound it proved on every split's ``max_time`` (s; with the floor it was given)."""

    frac: np.ndarray
    weight: np.ndarray
    bound_s: float


@dataclass(frozen=True)
class Reference:
    """The split of the uniform demand (every rank pair alike), solved once per deployment
    (module docstring, step 2): per group pair its candidate routes' fractions, and the mean
    link weights of that solve."""

    frac: dict[tuple[int, int], np.ndarray]
    weight: np.ndarray


def endpoint_bound_s(model: PathModel, demand: np.ndarray) -> float:
    """No plan moves ``demand``'s data faster (s): every byte a GPU sends crosses its uplink and
    every byte it receives its downlink."""
    cap = np.array([lk.gbs * 1e9 for lk in model.topology.graph.links])
    n = len(demand)
    up = np.array([cap[model.endpoint_links(i)[0]] for i in range(n)])
    down = np.array([cap[model.endpoint_links(i)[1]] for i in range(n)])
    out = demand.sum(axis=1) - np.diag(demand)
    into = demand.sum(axis=0) - np.diag(demand)
    return float(max((out / up).max(initial=0.0), (into / down).max(initial=0.0)))


def _units(agg: Aggregate, demand: np.ndarray) -> tuple[int, int]:
    """``split_work_s``'s units per mirror prox iteration (every column's links and every link),
    and beside them (the cold start's check, about two iterations, and every rank pair's
    pieces)."""
    per_iteration = len(agg.col_links) + len(agg.cap)
    return per_iteration, 2 * per_iteration + int(np.count_nonzero(demand))


def split_work_s(agg: Aggregate, demand: np.ndarray, iterations: int = SPLIT_ITERATIONS) -> float:
    """What solving the split in at most ``iterations`` and summing its pieces may cost the C++
    core (s), ``SPLIT_S_PER_UNIT`` per unit (no measured split costs more)."""
    per_iteration, fixed = _units(agg, demand)
    return (fixed + iterations * per_iteration) * SPLIT_S_PER_UNIT


def split_iterations(agg: Aggregate, demand: np.ndarray, slack_s: float) -> int | None:
    """The most iterations (``SPLIT_ITERATIONS`` at most) whose ``split_work_s`` a planning slack
    (s, ``model_aware.planning_slack``) pays for; None where it does not pay even for none."""
    per_iteration, fixed = _units(agg, demand)
    left = slack_s / SPLIT_S_PER_UNIT - fixed
    if not left > 0:
        return None
    return math.floor(min(SPLIT_ITERATIONS, left / per_iteration))


def used_links(agg: Aggregate) -> np.ndarray:
    """The links some column crosses, in order."""
    return np.unique(agg.col_links)


def uniform_weight(agg: Aggregate) -> np.ndarray:
    used = used_links(agg)
    weight = np.zeros(len(agg.cap))
    weight[used] = 1.0 / max(len(used), 1)
    return weight


def mirror_prox(
    agg: Aggregate,
    frac: np.ndarray,
    weight: np.ndarray,
    iterations: int,
    floor_s: float,
    tolerance: float,
) -> Split:
    """Mirror prox from ``frac`` and ``weight`` (module docstring, step 2): the best split found,
    the mean link weights and the bound. Each iteration's half-step split and link weights are scored
    (``max_time``, ``lower_bound``), and every ``MEAN_CHECK`` iterations their means (mirror
    prox's guarantee is for the means); it stops once the best split is within ``tolerance`` of
    the best bound or of ``floor_s`` (a time no plan beats, whatever its split)."""
    used = used_links(agg)
    scale = max(max_time(agg, frac), 1e-30)
    inv = np.zeros(len(agg.cap))
    inv[used] = 1.0 / (agg.cap[used] * scale)  # a link's load in units of the start's time
    n_pairs = len(agg.pairs)
    best, best_t = frac.copy(), max_time(agg, frac)
    bound = max(lower_bound(agg, weight), cut_bound(agg, frac))
    entry_col = np.repeat(np.arange(len(agg.col_pair)), np.diff(agg.col_ptr))
    unit = float(agg.cap[used].max()) * scale  # a route's cost per unit fraction: dimensionless

    def grad_frac(w: np.ndarray) -> np.ndarray:
        g = np.zeros(len(agg.col_pair))
        np.add.at(g, entry_col, (w * inv)[agg.col_links] * agg.col_coef)
        return g * unit

    def grad_weight(f: np.ndarray) -> np.ndarray:
        return link_loads(agg, f) * inv

    def certified() -> bool:
        return best_t <= max(bound, floor_s) * (1 + tolerance)

    total, total_w, done = np.zeros(len(frac)), np.zeros(len(weight)), 0
    while done < iterations and not certified():
        gf, gw = grad_frac(weight), grad_weight(frac)
        half_f = _normalise(frac * np.exp(-SPLIT_STEP * (gf - gf.min())), agg.col_pair, n_pairs)
        hw = weight * np.exp(SPLIT_STEP * (gw - gw[used].max()))
        half_w = hw / hw.sum()
        gf, gw = grad_frac(half_w), grad_weight(half_f)
        frac = _normalise(frac * np.exp(-SPLIT_STEP * (gf - gf.min())), agg.col_pair, n_pairs)
        nw = weight * np.exp(SPLIT_STEP * (gw - gw[used].max()))
        weight = nw / nw.sum()
        total, total_w, done = total + half_f, total_w + half_w, done + 1
        t = max_time(agg, half_f)
        if t < best_t * BETTER:
            best, best_t = half_f, t
        bound = max(bound, lower_bound(agg, half_w))
        if done % MEAN_CHECK == 0:
            mean = total / done
            t = max_time(agg, mean)
            if t < best_t * BETTER:
                best, best_t = mean, t
            bound = max(bound, lower_bound(agg, total_w / done), cut_bound(agg, best))
    bound = max(bound, floor_s)
    if not done:
        return Split(best, weight, bound)
    mean = total / done
    return Split(mean if max_time(agg, mean) < best_t * BETTER else best, total_w / done, bound)


def solve(
    agg: Aggregate,
    warm: np.ndarray | None = None,
    start: Start | None = None,
    floor_s: float = 0.0,
    iterations: int = SPLIT_ITERATIONS,
) -> Split:
    """Step 2: the column fractions of least ``max_time`` found by mirror prox (module
    docstring), within ``SPLIT_TOLERANCE`` of the optimum or of ``floor_s`` where certified. It
    starts from ``start`` (``reference_start``) unless the cold start is certified already (the
    split then moves no byte it need not: many splits tie on the most loaded link, and the
    contention models charge them differently), else from ``warm`` (a previous call's fractions
    of the same columns; ``WARM_ITERATIONS`` at most), else cold (``initial_fractions``, uniform
    link weights); ``iterations`` at most either way (``split_iterations``: as many as its
    planning may pay for)."""
    if not len(agg.col_pair):
        return Split(np.zeros(0), uniform_weight(agg), max(floor_s, max_time(agg, np.zeros(0))))
    if warm is not None and len(warm) != len(agg.col_pair):
        raise TopologyError(
            f"warm start: {len(warm)} fractions for a split of {len(agg.col_pair)} columns"
        )
    if start is not None:
        cold = mirror_prox(
            agg, initial_fractions(agg), uniform_weight(agg), 0, floor_s, SPLIT_TOLERANCE
        )
        if max_time(agg, cold.frac) <= cold.bound_s * (1 + SPLIT_TOLERANCE):
            return cold  # already certified: the split moves no byte it need not
        frac, weight, most = start.frac, start.weight, SPLIT_ITERATIONS
    elif warm is not None:
        frac, weight = np.asarray(warm, dtype=np.float64), uniform_weight(agg)
        most = WARM_ITERATIONS
    else:
        frac, weight, most = initial_fractions(agg), uniform_weight(agg), SPLIT_ITERATIONS
    return mirror_prox(agg, frac, weight, min(most, iterations), floor_s, SPLIT_TOLERANCE)


def uniform_demand(model: PathModel) -> np.ndarray:
    """One byte between every two ranks that have a path: the demand the reference split is
    solved for."""
    group_of = np.asarray(model.group_of)
    g = int(group_of.max()) + 1
    linked = np.array([[bool(model.routes(a, d)) for d in range(g)] for a in range(g)])
    demand = linked[group_of[:, None], group_of[None, :]].astype(np.int64)
    np.fill_diagonal(demand, 0)
    return demand


@functools.lru_cache(maxsize=16)
def reference(model: PathModel) -> Reference:
    """The deployment's reference split (``Reference``), solved cold to ``REFERENCE_TOLERANCE``
    or ``REFERENCE_ITERATIONS``: it depends on the topology alone, so every process derives the
    same one and a call's split does not depend on the calls before it."""
    agg = aggregate(model, uniform_demand(model))
    if not len(agg.col_pair):
        return Reference({}, np.zeros(len(agg.cap)))
    found = mirror_prox(
        agg,
        initial_fractions(agg),
        uniform_weight(agg),
        REFERENCE_ITERATIONS,
        0.0,
        REFERENCE_TOLERANCE,
    )
    out = {}
    for p in agg.choice:
        out[agg.pairs[p]] = found.frac[agg.col_pair == p]
    return Reference(out, found.weight)


def reference_start(agg: Aggregate, ref: Reference) -> Start:
    """Mirror prox's start from the reference split: each column's fraction as the reference
    routes the same group pair (renormalised), and the reference's link weights on the links
    ``agg``'s columns cross, mixed with ``START_MIX`` of uniform weights so none starts at 0."""
    frac = initial_fractions(agg)  # for a group pair the uniform demand leaves out (a self-send)
    for p in agg.choice:
        if agg.pairs[p] in ref.frac:
            frac[agg.col_pair == p] = ref.frac[agg.pairs[p]]
    frac = _normalise(frac, agg.col_pair, len(agg.pairs))
    uniform = uniform_weight(agg)
    weight = np.where(uniform > 0, ref.weight, 0.0)
    total = weight.sum()
    weight = uniform if total <= 0 else (1 - START_MIX) * weight / total + START_MIX * uniform
    return Start(frac, weight)


def expand(
    model: PathModel,
    demand: np.ndarray,
    agg: Aggregate,
    frac: np.ndarray,
    lambda_s: float,
    rank: int | None = None,
) -> Schedule:
    """Step 3: the paced one-step schedule of ``frac``; with ``rank``, only the transfers that
    rank sends or receives, in the same order (the horizon is still every pair's)."""
    n = len(demand)
    cap = agg.cap
    load = np.zeros(len(cap))
    pieces: list[tuple[int, int, Route, int]] = []
    split_time = 0.0
    for i, j, r, x in _pieces(model, demand, agg, frac):
        links = model.path(i, j, r).links
        load[list(links)] += x
        split_time = max(split_time, x / (r.rate * 1e9))
        if rank is None or rank in (i, j):
            pieces.append((i, j, r, x))
    with np.errstate(divide="ignore", invalid="ignore"):
        link_time = np.where(cap > 0, load / cap, 0.0)
    horizon = max(float(link_time.max(initial=0.0)), split_time) * (1 + 1e-6)
    transfers = []
    for i, j, r, x in pieces:
        path = model.path(i, j, r)
        rate = min(r.rate, x / (horizon * 1e9)) if horizon > 0 else r.rate
        transfers.append(Transfer(i, j, path.links, x, (i, j), rate, r.cls, r.staged))
    steps = [Step(tuple(transfers))] if len(agg.pairs) else []
    meta = {
        "scheduler": "variopath",
        "activations": len(steps),
        "paced": True,
        "horizon_s": horizon,
        "split": "mirror-prox",
    }
    if rank is not None:
        meta["rank"] = rank
    return Schedule(n, steps, model.topology.fingerprint, lambda_s, "general", meta)


def _pieces(
    model: PathModel,
    demand: np.ndarray,
    agg: Aggregate,
    frac: np.ndarray,
    proportional: bool = False,
) -> list[tuple[int, int, Route, int]]:
    """Every rank pair's pieces (i, j, route, bytes) in row-major order: its bytes cut at its
    offset in its group pair along the routes' segments (``_route_bounds``, ``_segment``), or
    all on its group pair's one route; ``proportional``: every rank pair cut by the fractions
    themselves (``_segment`` of its own bounds ⌊D_ij Σ_{r' ≤ r} p⌋), so each rank's endpoint
    links carry its share of every column (``phase_aggregate``)."""
    group_of = np.asarray(model.group_of)
    pair_index = {p: k for k, p in enumerate(agg.pairs)}
    first_col = np.full(len(agg.pairs), -1, dtype=np.int64)
    for c in range(len(agg.col_pair) - 1, -1, -1):
        first_col[agg.col_pair[c]] = c
    bounds = _route_bounds(agg, frac)
    offset = np.zeros(len(agg.pairs), dtype=np.int64)
    out = []
    for i, j in zip(*np.nonzero(demand), strict=True):
        i, j = int(i), int(j)
        volume = int(demand[i, j])
        p = pair_index[(int(group_of[i]), int(group_of[j]))]
        routes = agg.routes[p]
        if first_col[p] < 0:
            share = [volume]
        elif proportional:
            own = frac[first_col[p] : first_col[p] + len(routes)]
            ends = np.floor(volume * np.cumsum(own)).astype(np.int64)
            ends[-1] = volume
            share = _segment(np.minimum(np.maximum.accumulate(ends), volume), 0, volume)
        else:
            share = _segment(bounds[first_col[p] : first_col[p] + len(routes)], offset[p], volume)
        offset[p] += volume
        out.extend((i, j, r, x) for r, x in zip(routes, share, strict=True) if x)
    return out


def _route_bounds(agg: Aggregate, frac: np.ndarray) -> np.ndarray:
    """Per column, the end of its route's segment of the group pair's bytes: ⌊V Σ_{r' ≤ r} p⌋
    (the last route's is V). A group pair's rank pairs, in row-major order, lay their bytes one
    after another along [0, V) and each byte takes the route whose segment it falls in, so every
    route carries its share to the byte and most rank pairs use one route."""
    out = np.zeros(len(frac), dtype=np.int64)
    for c0 in np.flatnonzero(np.diff(np.concatenate([[-1], agg.col_pair])) != 0):
        p = int(agg.col_pair[c0])
        c1 = c0 + int(np.sum(agg.col_pair == p))
        volume = round(float(agg.volume[p]))
        ends = np.floor(volume * np.cumsum(frac[c0:c1])).astype(np.int64)
        ends[-1] = volume
        out[c0:c1] = np.minimum(np.maximum.accumulate(ends), volume)
    return out


def _segment(bounds: np.ndarray, offset: int, volume: int) -> list[int]:
    """A rank pair's bytes per route: the overlap of [offset, offset + volume) with each route's
    segment (``_route_bounds``); pieces under ``PACED_MIN_BYTES`` (or a millionth of the pair)
    join the pair's largest piece."""
    lo = np.concatenate([[0], bounds[:-1]])
    out = np.maximum(0, np.minimum(offset + volume, bounds) - np.maximum(offset, lo))
    top = int(np.argmax(out))
    out[out < max(PACED_MIN_BYTES, volume // 1_000_000)] = 0
    out[top] += volume - int(out.sum())
    return [int(x) for x in out]


def paced_online(
    model: PathModel,
    demand: np.ndarray,
    lambda_s: float,
    warm: np.ndarray | None = None,
    rank: int | None = None,
    iterations: int = SPLIT_ITERATIONS,
) -> tuple[Schedule, np.ndarray]:
    """``paced`` with its split solved online (module docstring): the schedule (or ``rank``'s
    share of it; ``meta["bound_s"]``: the split's proven lower bound on every plan's data time
    over the same routes) and the column fractions. Without ``warm`` (a previous call's
    fractions) the split starts from the deployment's reference; it stops early once within 1%
    of the optimum or of the endpoint bound, after ``iterations`` at most."""
    demand = np.asarray(demand)
    agg = aggregate(model, demand)
    start = None if warm is not None else reference_start(agg, reference(model))
    found = solve(agg, warm, start, endpoint_bound_s(model, demand), iterations)
    plan = expand(model, demand, agg, found.frac, lambda_s, rank)
    plan.meta["bound_s"] = found.bound_s
    return plan, found.frac


# ----- the rotation's split (model_aware.py rot_paced) --------------------------------------------
FREE, OWN = -1, 0  # a route's phase: it writes on no uplink; it writes toward its uplink's own
# root complex or on two uplinks (dropped from the rotation's candidates); ffi/choice.cc kFree, kOwn
PHASE_START_FLOOR = 1e-12  # added to every paced fraction the rotation's split starts from (none
# starts at 0, where mirror prox would keep it); ffi/choice.cc kPhaseStartFloor


@dataclass(frozen=True)
class Phased:
    """The rotation's split problem (``phase_aggregate``): an ``Aggregate`` whose resources are
    (link l, phase k) for k = 1..K (resource (k - 1) L + l, capacity C_l / K), K = R - 1 the
    phases of a node of R root complexes; ``source`` per column its column in the paced
    ``aggregate`` of the same demand (its fraction there starts the solve)."""

    agg: Aggregate
    phases: int
    source: np.ndarray


def route_phase(model: PathModel, ports: RootPorts, a: int, d: int, route: Route) -> int:
    """The phase of group pair (a, d)'s transfers on ``route`` (its first ranks' path): (b - c)
    mod R where it pushes writes up through one uplink of root complex c toward root complex b
    (``RootPorts.writes``), ``FREE`` where it writes on none, ``OWN`` where b = c or it writes on
    two uplinks."""
    members = np.flatnonzero(np.asarray(model.group_of) == d)
    i = int(np.flatnonzero(np.asarray(model.group_of) == a)[0])
    j = int(next((m for m in members if m != i), members[0]))
    writes = ports.writes(model.path(i, j, route).links, route.staged, False)
    if not writes:
        return FREE
    if len(writes) > 1:
        return OWN
    return ports.phase(*writes[0])


def phase_aggregate(model: PathModel, demand: np.ndarray) -> Phased | None:
    """The paced split with R - 1 equal phases (model_aware.py ``rot_paced``): a group pair's
    candidate routes but those of phase ``OWN`` (None where a pair has no other); a route of
    phase k puts its bytes on (l, k) for its links l, a ``FREE`` one 1/K of them on every (l, k);
    a pair of one route is a fixed base load. None where a node has one root complex."""
    ports = RootPorts(model.topology)
    R = ports.complexes
    if R < 2:
        return None
    K = R - 1
    paced = aggregate(model, demand)
    L = len(paced.cap)
    base = np.zeros(K * L)
    routes, choice = [], []
    col_pair, col_ptr, col_links, col_coef, source = [], [0], [], [], []
    paced_first = {int(p): int(np.argmax(paced.col_pair == p)) for p in paced.choice}
    group_of = np.asarray(model.group_of)
    g = int(group_of.max()) + 1
    n = len(demand)
    ends = [model.endpoint_links(i) for i in range(n)]
    # per rank and group: its bytes toward the group's ranks, and from them
    sent = np.zeros((n, g))
    np.add.at(sent, (slice(None), group_of), demand.astype(np.float64))
    got = np.zeros((g, n))
    np.add.at(got, group_of, demand.astype(np.float64))

    def footprint(a: int, d: int, route: Route, volume: float) -> tuple[list[int], list[float]]:
        """A route's links (share 1) and, through the endpoints, each rank's endpoint links
        (share: its part of the group pair's bytes)."""
        links, share = list(route.links), [1.0] * len(route.links)
        if route.via_endpoints:
            for i in np.flatnonzero(group_of == a):
                if sent[i, d]:
                    links.append(ends[i][0])
                    share.append(sent[i, d] / volume)
            for j in np.flatnonzero(group_of == d):
                if got[a, j]:
                    links.append(ends[j][1])
                    share.append(got[a, j] / volume)
        return links, share

    def resources(links: list[int], share: list[float], phase: int):
        if phase == FREE:
            return [k * L + lk for k in range(K) for lk in links], [s / K for s in share] * K
        return [(phase - 1) * L + lk for lk in links], share

    for p, ((a, d), rs) in enumerate(zip(paced.pairs, paced.routes, strict=True)):
        phases = [route_phase(model, ports, a, d, r) for r in rs]
        kept = [k for k, ph in enumerate(phases) if ph != OWN]
        if not kept:
            return None
        routes.append(tuple(rs[k] for k in kept))
        if len(kept) == 1:
            on, share = resources(*footprint(a, d, rs[kept[0]], paced.volume[p]), phases[kept[0]])
            np.add.at(base, on, paced.volume[p] * np.array(share))
            continue
        choice.append(p)
        for k in kept:
            on, share = resources(*footprint(a, d, rs[k], paced.volume[p]), phases[k])
            col_pair.append(p)
            col_links.extend(on)
            col_coef.extend(share)
            col_ptr.append(len(col_links))
            source.append(paced_first[p] + k if p in paced_first else -1)
    agg = Aggregate(
        paced.pairs,
        routes,
        paced.volume,
        base,
        np.tile(paced.cap / K, K),
        np.array(choice, dtype=np.int64),
        np.array(col_pair, dtype=np.int64),
        np.array(col_ptr, dtype=np.int64),
        np.array(col_links, dtype=np.int64),
        np.array(col_coef, dtype=np.float64),
    )
    return Phased(agg, K, np.array(source, dtype=np.int64))


def phase_start(phased: Phased, paced_frac: np.ndarray | None) -> Start | None:
    """The rotation's split starts from the paced split's fractions of the same routes
    (renormalised over the routes kept) and uniform weights; None without them (cold)."""
    if paced_frac is None or not len(phased.source):
        return None
    frac = np.maximum(paced_frac[phased.source], 0.0) + PHASE_START_FLOOR
    agg = phased.agg
    return Start(_normalise(frac, agg.col_pair, len(agg.pairs)), uniform_weight(agg))


def expand_rotated(
    model: PathModel, demand: np.ndarray, phased: Phased, frac: np.ndarray, lambda_s: float
) -> Schedule | None:
    """The rotation's one-step schedule of ``frac`` (model_aware.py ``rot_paced``): ``expand``'s
    pieces; the horizon T the least under which every (link, phase) carries its phase's pushed
    bytes plus 1/K of its free bytes in T / K (endpoint links included) and no piece runs above
    its route's rate; a free piece paced at x / T from the start, a piece of phase k at K x / T
    after its uplink's pieces of the nearest earlier phase that has some. Transfers ordered by
    phase (stable; free first). None where a piece writes toward its own root complex or on two
    uplinks, or no uplink writes toward two root complexes (it would be paced)."""
    ports, K = RootPorts(model.topology), phased.phases
    cap = np.array([lk.gbs * 1e9 for lk in model.topology.graph.links])
    pushed = np.zeros((K, len(cap)), dtype=np.int64)
    free = np.zeros(len(cap), dtype=np.int64)
    pieces = []
    own = 0.0  # the longest piece at its route's rate, a phase's at K times its bytes
    for i, j, r, x in _pieces(model, demand, phased.agg, frac, proportional=True):
        path = model.path(i, j, r)
        writes = ports.writes(path.links, r.staged, False)
        if len(writes) > 1:
            return None
        up, phase = -1, FREE
        if writes:
            up = writes[0][0]
            phase = ports.phase(*writes[0])
            if phase == OWN:
                return None
            pushed[phase - 1, list(path.links)] += x
            own = max(own, K * x / (r.rate * 1e9))
        else:
            free[list(path.links)] += x
            own = max(own, x / (r.rate * 1e9))
        pieces.append((i, j, r, x, path, up, phase))
    phases_of: dict[int, set[int]] = {}
    for *_, up, phase in pieces:
        if up >= 0:
            phases_of.setdefault(up, set()).add(phase)
    if all(len(ph) < 2 for ph in phases_of.values()):
        return None
    with np.errstate(divide="ignore", invalid="ignore"):
        link_time = np.where(cap > 0, (K * pushed + free) / cap, 0.0)
    horizon = max(float(link_time.max(initial=0.0)), own) * (1 + 1e-6)
    order = sorted(range(len(pieces)), key=lambda k: pieces[k][6])
    members: dict[tuple[int, int], list[int]] = {}
    transfers = []
    for k, index in enumerate(order):
        i, j, r, x, path, up, phase = pieces[index]
        speed = 1 if phase == FREE else K
        rate = min(r.rate, speed * x / (horizon * 1e9)) if horizon > 0 else r.rate
        after: tuple[tuple[int, int], ...] = ()
        if phase != FREE:
            before = next((q for q in range(phase - 1, 0, -1) if (up, q) in members), None)
            after = () if before is None else tuple((0, w) for w in members[up, before])
            members.setdefault((up, phase), []).append(k)
        transfers.append(Transfer(i, j, path.links, x, (i, j), rate, r.cls, r.staged, after))
    meta = {
        "scheduler": "variopath",
        "activations": 1,
        "paced": True,
        "horizon_s": horizon,
        "split": "mirror-prox",
    }
    steps = [Step(tuple(transfers))]
    return Schedule(len(demand), steps, model.topology.fingerprint, lambda_s, "general", meta)


def rot_paced_online(
    model: PathModel,
    demand: np.ndarray,
    lambda_s: float,
    paced_frac: np.ndarray | None = None,
    floor_s: float = 0.0,
    iterations: int = SPLIT_ITERATIONS,
) -> Schedule | None:
    """``paced`` with R - 1 equal phases, so that no uplink into a root port pushes writes toward
    two root complexes at once (model_aware.py imports it as ``rot_paced``;
    research/trigger-prototype.md "A trigger-free family: rotation";
    ffi/choice.cc ``ChoiceCore::rot_paced`` is its twin). A transfer pushing writes up through a
    root port (``RootPorts.writes``) has the phase (b - a) mod R, a and b the local indices of
    the uplink's and the target's root complexes among the node's R; the split knows the phases
    (``split.phase_aggregate``: the paced split over (link, phase) resources of capacity C / K,
    K = R - 1, a transfer writing on no uplink spread evenly over the phases; routes writing
    toward their own root complex or on two uplinks dropped), solved by mirror prox from the
    paced split's fractions (``paced_frac``; else cold) and certified against ``floor_s`` (the
    paced split's bound: no phase split beats it); phase k runs during [(k - 1) T / K, k T / K],
    each of its transfers waiting (``after``) for its uplink's transfers of the nearest earlier
    phase that has some (``split.expand_rotated``). None where a node has one root complex, a
    group pair has only dropped routes, or no uplink writes toward two root complexes."""
    demand = np.asarray(demand)
    phased = phase_aggregate(model, demand)
    if phased is None:
        return None
    start = phase_start(phased, paced_frac)
    found = solve(phased.agg, None, start, floor_s, iterations)
    plan = expand_rotated(model, demand, phased, found.frac, lambda_s)
    if plan is not None:
        plan.meta["bound_s"] = found.bound_s
    return plan
