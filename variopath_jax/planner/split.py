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
   weighting (``lower_bound``), or after at most ``SPLIT_ITERATIONS``; a route's cost is its
   links' weights per unit of capacity, the same scale for every pair whatever its volume
   (weighting it by the volume left small pairs unmoved: 5.6% over the LP on l20-cx7 x 2 after
   400 iterations); the answer is the best iterate or mean iterate found (mirror prox's
   guarantee is for the means); optionally warm-started from a previous call's fractions (every
   rank holds the same history, so all derive the same split).
3. **expand**: a group pair's rank pairs lay their bytes one after another, in row-major order,
   along the group pair's routes in proportion to its fractions (``_route_bounds``), so the links
   beyond the endpoint links see exactly the aggregated load, in whole bytes, and most rank
   pairs take one route;
   the horizon T' is the rounded split's own min-max time, from every pair's rounded bytes, so
   every rank derives the same T' while building only its own transfers (``rank=``).

The route caps x ≤ bw(r) T of the LP are implied by the link constraints when routes run at
their slowest link's capacity (efficiency 1, no measured rate caps): then the split is within the
solver's tolerance of the LP optimum (tests check 1% against HiGHS). Otherwise the horizon still
takes them into account, but the split does not optimise for them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from variopath_jax.errors import TopologyError
from variopath_jax.planner.lp import PACED_MIN_BYTES, PACED_ROUTES
from variopath_jax.schedule import Schedule, Step, Transfer
from variopath_jax.topology import PathModel
from variopath_jax.topology.paths import Route

SPLIT_ITERATIONS = 150  # at most this many mirror prox iterations from a cold start
WARM_ITERATIONS = 30  # from a warm start
SPLIT_STEP = 2.0  # mirror prox step (the saddle function is scaled to about 1)
SPLIT_TOLERANCE = 0.01  # stop once the best split is within 1% of the dual bound
BETTER = 1 - 1e-12  # a split replaces the best one only if this much faster: ties (within float
# rounding, which differs between this reference and the C++ core) keep the earlier
MEAN_CHECK = 10  # every this many iterations, the mean iterate and mean weights are checked too


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


def _normalise(frac: np.ndarray, col_pair: np.ndarray, pairs: int) -> np.ndarray:
    total = np.zeros(pairs)
    np.add.at(total, col_pair, frac)
    return frac / total[col_pair]


def solve(agg: Aggregate, warm: np.ndarray | None = None) -> np.ndarray:
    """Step 2: the column fractions of least ``max_time`` found by mirror prox (module
    docstring); ``warm``: a previous call's fractions of the same columns. Each iteration's
    half-step split and link weights are scored (``max_time``, ``lower_bound``), and every
    ``MEAN_CHECK`` iterations their means (mirror prox's guarantee is for the means); it stops
    once the best split is within ``SPLIT_TOLERANCE`` of the best bound."""
    if not len(agg.col_pair):
        return np.zeros(0)
    if warm is not None and len(warm) != len(agg.col_pair):
        raise TopologyError(
            f"warm start: {len(warm)} fractions for a split of {len(agg.col_pair)} columns"
        )
    frac = initial_fractions(agg) if warm is None else np.asarray(warm, dtype=np.float64)
    iterations = SPLIT_ITERATIONS if warm is None else WARM_ITERATIONS
    used = np.unique(agg.col_links)
    scale = max(max_time(agg, frac), 1e-30)
    inv = np.zeros(len(agg.cap))
    inv[used] = 1.0 / (agg.cap[used] * scale)  # a link's load in units of the start's time
    n_pairs = len(agg.pairs)
    weight = np.zeros(len(agg.cap))
    weight[used] = 1.0 / len(used)
    best, best_t = frac.copy(), max_time(agg, frac)

    entry_col = np.repeat(np.arange(len(agg.col_pair)), np.diff(agg.col_ptr))

    unit = float(agg.cap[used].max()) * scale  # a route's cost per unit fraction: dimensionless

    def grad_frac(w: np.ndarray) -> np.ndarray:
        g = np.zeros(len(agg.col_pair))
        np.add.at(g, entry_col, (w * inv)[agg.col_links] * agg.col_coef)
        return g * unit

    def grad_weight(f: np.ndarray) -> np.ndarray:
        return link_loads(agg, f) * inv

    total, total_w = np.zeros(len(frac)), np.zeros(len(weight))
    bound, done = 0.0, 0
    for it in range(iterations):
        gf, gw = grad_frac(weight), grad_weight(frac)
        half_f = _normalise(frac * np.exp(-SPLIT_STEP * (gf - gf.min())), agg.col_pair, n_pairs)
        hw = weight * np.exp(SPLIT_STEP * (gw - gw[used].max()))
        half_w = hw / hw.sum()
        gf, gw = grad_frac(half_w), grad_weight(half_f)
        frac = _normalise(frac * np.exp(-SPLIT_STEP * (gf - gf.min())), agg.col_pair, n_pairs)
        nw = weight * np.exp(SPLIT_STEP * (gw - gw[used].max()))
        weight = nw / nw.sum()
        total, total_w, done = total + half_f, total_w + half_w, it + 1
        t = max_time(agg, half_f)
        if t < best_t * BETTER:
            best, best_t = half_f, t
        bound = max(bound, lower_bound(agg, half_w))
        if done % MEAN_CHECK == 0:
            mean = total / done
            t = max_time(agg, mean)
            if t < best_t * BETTER:
                best, best_t = mean, t
            bound = max(bound, lower_bound(agg, total_w / done))
        if best_t <= bound * (1 + SPLIT_TOLERANCE):
            break
    mean = total / max(done, 1)
    return mean if max_time(agg, mean) < best_t * BETTER else best


def expand(
    model: PathModel,
    demand: np.ndarray,
    agg: Aggregate,
    frac: np.ndarray,
    lambda_s: float,
    rank: int | None = None,
) -> Schedule:
    """Step 3: the paced one-step schedule of ``frac``; with ``rank``, only the transfers that
    rank sends (the horizon is still every pair's)."""
    n = len(demand)
    group_of = np.asarray(model.group_of)
    pair_index = {p: k for k, p in enumerate(agg.pairs)}
    first_col = np.full(len(agg.pairs), -1, dtype=np.int64)
    for c in range(len(agg.col_pair) - 1, -1, -1):
        first_col[agg.col_pair[c]] = c
    cap = agg.cap
    load = np.zeros(len(cap))
    pieces: list[tuple[int, int, Route, int]] = []
    split_time = 0.0
    bounds = _route_bounds(agg, frac)
    offset = np.zeros(len(agg.pairs), dtype=np.int64)
    for i, j in zip(*np.nonzero(demand), strict=True):
        i, j = int(i), int(j)
        volume = int(demand[i, j])
        p = pair_index[(int(group_of[i]), int(group_of[j]))]
        routes = agg.routes[p]
        if first_col[p] < 0:
            share = [volume]
        else:
            share = _segment(bounds[first_col[p] : first_col[p] + len(routes)], offset[p], volume)
        offset[p] += volume
        for r, x in zip(routes, share, strict=True):
            if not x:
                continue
            links = model.path(i, j, r).links
            load[list(links)] += x
            split_time = max(split_time, x / (r.rate * 1e9))
            if rank is None or i == rank:
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
) -> tuple[Schedule, np.ndarray]:
    """``paced`` with its split solved online (module docstring): the schedule (or ``rank``'s
    share of it) and the column fractions, to warm-start the next call with."""
    agg = aggregate(model, np.asarray(demand))
    frac = solve(agg, warm)
    return expand(model, np.asarray(demand), agg, frac, lambda_s, rank), frac
