"""Hybrid plans: time division where concurrency collapses, paced multipath where links share
well (issue 27 item 2; research/hybrid-prototype.md).

No measurement shows that pacing saves concurrent transfers through a CPU root complex
(research/contention-evidence.md), so the conservative network model charges a root-complex
link (classes ``root_p2p`` and ``root_dma``) by flow count whenever two or more flows cross it,
paced or not. Switch and NIC links keep the rule that rate caps which fit lose nothing. The
plans here therefore keep every root-complex link to one flow at a time, the paper's own premise
for a channel (§3: each resource in U used by one lane), and pace everything else:

- **root entries**: a column (a pair's bytes on one candidate route) whose path crosses a
  root-complex link. They are coloured greedily into *phases* such that the entries of one phase
  cross pairwise disjoint root-complex links: each phase is a contention-free channel restricted
  to the root-complex resources of U (paper §4.1's CANADD test on that subset).
- ``phased``: an LP over the phases,  min Σ_k t_k  s.t. every pair's bytes split over its routes
  and phases (a root entry only in its own phase), every link's bytes of phase k at most C_l t_k,
  every column's at most bw t_k; each phase's pieces are paced to end together, a root entry
  o + L + σ earlier. Phase boundaries are signals, no barrier: a node's next phase starts when
  its root entries of the previous one have ended (a node's phases without a root entry join
  the next one into one window). Each root entry a phase holds costs its gap there, bytes or
  none, so (issue 31) ``phased`` runs only the entries worth their gaps (``used_entries``: the
  phases merged into one horizon, each entry's gap linearised by dynamic slope scaling), coloured
  first fit by decreasing duration (``colour_by_duration``), unless the greedy colouring of every
  entry gives a shorter LP.
- ``chained``: the root entries of every root-complex link run one after another in phase
  order, chained by signals and paced at a reserved rate r, and every other column is paced once
  over the whole horizon on what the reservation leaves (the paced LP with r taken off each
  link's capacity, and every phase's longest entry plus its signal gap summed within the
  horizon); r is the best of ``CHAIN_RATES`` by the LP's time.

What they need from the catalog (paper §4.1): its group-level path instances (the candidate
routes of ``PathModel.routes``, pruned by PRUNEPATHS) and their resource footprints L(r), to know
which root entries may share a phase. They do not need its shapes and families: a hybrid phase
constrains only the root-complex subset of U (the rest is paced, not exclusive) and need not be a
full permutation, so a family, which fixes every resource and every lane, is stricter than the
conservative rule asks and would cost phases.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math

import numpy as np
import scipy.optimize
import scipy.sparse

from variopath_jax.errors import TopologyError
from variopath_jax.planner.lp import (
    PACED_MIN_BYTES,
    PACED_ROUTES,
    Columns,
    route_columns,
    whole_bytes,
)
from variopath_jax.planner.split import (
    SPLIT_ITERATIONS,
    SPLIT_TOLERANCE,
    WARM_ITERATIONS,
    Aggregate,
    Start,
    initial_fractions,
    mirror_prox,
    uniform_demand,
    uniform_weight,
)
from variopath_jax.schedule import Schedule, Step, Transfer
from variopath_jax.schedulers import PlanRequest, transfer
from variopath_jax.sim.network import LINK_CLASSES, PCIE, NetworkModel, link_classes, through_nic
from variopath_jax.topology import PathModel, Topology

SLOPE_ROUNDS = 4  # the most LPs ``used_entries`` solves
PHASE_REL = 1e-6  # the entries worth their gaps replace the greedy colouring when this much shorter
MERGE_REL = 0.02  # a column's pieces in consecutive phases within 2% of one rate run as one
ROOT = list(LINK_CLASSES).index("root_p2p")  # link_classes' index for both root classes


def root_links(topo: Topology) -> np.ndarray:
    """Per directed link: does it join a CPU root complex (or two sockets)."""
    return link_classes(topo) == ROOT


@dataclasses.dataclass(frozen=True)
class Phases:
    """The root entries (columns crossing a root-complex link) coloured into phases."""

    entry: np.ndarray  # column indices of the root entries
    phase: np.ndarray  # the phase of each root entry
    count: int  # number of phases
    root_of: list[frozenset[int]]  # root-complex links of each root entry


def colour(col: Columns, topo: Topology) -> Phases:
    """First-fit colouring of the root entries: an entry goes to the first phase none of whose
    entries shares a root-complex link with it. Entries are taken busiest root link first, then
    by rotation distance (j - i mod N) so that a rank's entries spread over the phases."""
    root = root_links(topo)
    incidence = col.links.tocsc()
    entries, root_of = [], []
    for c in range(col.size):
        lids = incidence.indices[incidence.indptr[c] : incidence.indptr[c + 1]]
        hit = frozenset(int(lid) for lid in lids if root[lid])
        if hit:
            entries.append(c)
            root_of.append(hit)
    load: dict[int, int] = {}
    for hit in root_of:
        for lid in hit:
            load[lid] = load.get(lid, 0) + 1
    n = max(topo.num_ranks, 1)

    def key(e: int) -> tuple:
        i, j, _ = col.pieces[entries[e]]
        return (-max(load[lid] for lid in root_of[e]), (j - i) % n, i, entries[e])

    phase = np.full(len(entries), -1, dtype=np.int64)
    taken: list[set[int]] = []
    for e in sorted(range(len(entries)), key=key):
        k = next((k for k, used in enumerate(taken) if not used & root_of[e]), len(taken))
        if k == len(taken):
            taken.append(set())
        taken[k] |= root_of[e]
        phase[e] = k
    return Phases(np.array(entries, dtype=np.int64), phase, len(taken), root_of)


def _slowest(col: Columns, cap: np.ndarray) -> np.ndarray:
    """Each column's slowest link capacity (GB/s)."""
    inc = col.links.tocsc()
    return np.array(
        [cap[inc.indices[inc.indptr[c] : inc.indptr[c + 1]]].min() for c in range(col.size)]
    )


def _solve(
    cost: np.ndarray, a_ub, b_ub: np.ndarray, a_eq, b_eq: np.ndarray, what: str
) -> np.ndarray:
    """The phased LP by HiGHS's interior point (with crossover, so a vertex), or by its dual
    simplex where the interior point gives no optimum. Both are deterministic."""
    lp = None
    for method in ("highs-ipm", "highs-ds"):
        lp = scipy.optimize.linprog(
            cost,
            A_ub=a_ub.tocsr(),
            b_ub=b_ub,
            A_eq=a_eq.tocsr(),
            b_eq=b_eq,
            bounds=(0, None),
            method=method,
        )
        if lp.status == 0:
            return lp.x
    raise TopologyError(f"the {what} plan's LP failed: {lp.message}")


def phased(
    model: PathModel, demand: np.ndarray, lambda_s: float, network: NetworkModel = PCIE
) -> Schedule:
    """The phased hybrid plan (module docstring): root entries time-divided into phases, all other
    bytes split over the phases by an LP and paced within them; phase boundaries are signals.

    A phase's root entry is paced to end ``gap`` (o + L + σ of ``network``) before its phase does,
    so that its signal starts the next phase on time; the LP keeps that gap free on every link
    the entry crosses. Which entries run, and in which phases (issue 31, ``_fewer_entries``):
    those worth their gaps (``used_entries``) coloured by duration (``colour_by_duration``) where
    that LP is shorter, else every entry coloured greedily (``colour``)."""
    topo = model.topology
    col = route_columns(model, demand)
    if not col.size:
        return Schedule(len(demand), [], topo.fingerprint, lambda_s, "general", _meta("phased", 0))
    ph = colour(col, topo)
    gap = _gaps(col, ph, topo, network)
    if len(ph.entry):
        ph, gap, lp = _fewer_entries(col, ph, topo, gap)
    else:
        lp = phase_lp(col, ph, topo, gap)
    return _emit_phases(
        model, col, ph, lp.phases, lp.piece_col, lp.piece_phase, lp.nbytes, gap, lambda_s
    )


def _fewer_entries(
    col: Columns, ph: Phases, topo: Topology, gap: np.ndarray
) -> tuple[Phases, np.ndarray, PhaseLP]:
    """``phased``'s colouring and its LP (issue 31): the entries worth their gaps coloured by
    duration where their LP is shorter than the greedy colouring's of every entry (by more than
    ``PHASE_REL``), else the greedy colouring. Each colouring's LP is solved only where the
    merged bound on its entries (``entries_bound``) leaves it room to decide: the one with the
    lower bound first, the other only if it can still win."""
    keep, duration = used_entries(col, ph, topo, gap)
    used = colour_by_duration(ph, keep, duration)
    every = entries_bound(col, ph, topo, gap, np.arange(len(ph.entry)))
    kept = entries_bound(col, ph, topo, gap, keep)
    if kept < every * (1 - PHASE_REL):
        found = phase_lp(col, used, topo, gap[keep])
        if found.span_ns < every * (1 - PHASE_REL):  # no colouring of every entry comes near
            return used, gap[keep], found
        greedy = phase_lp(col, ph, topo, gap)
    else:
        greedy = phase_lp(col, ph, topo, gap)
        if kept >= greedy.span_ns * (1 - PHASE_REL):  # the entries kept cannot win
            return ph, gap, greedy
        found = phase_lp(col, used, topo, gap[keep])
    if found.span_ns < greedy.span_ns * (1 - PHASE_REL):
        return used, gap[keep], found
    return ph, gap, greedy


def _merged_lp(
    col: Columns,
    ph: Phases,
    topo: Topology,
    charge: np.ndarray,
    held: np.ndarray,
    dropped: np.ndarray,
) -> tuple[np.ndarray, float]:
    """The phases merged into one horizon T (the hybrid MILP's any-K bound, docs/solver.md, with
    each entry's use fixed): min T over every column's bytes v, pairs served, such that

    - an entry's v (1/bw + charge) + held ≤ T, and so is the sum over a root-complex link's
      entries (they run one per phase);
    - a shared link's load ≤ C T, and its load / C + the charge and held gaps of the entries
      crossing it and one root-complex link ≤ T (each holds its gap there in its own phase);
    - a column below its slowest link: v ≤ bw T.

    ``charge`` (ns per byte, per column) and ``held`` (ns, per entry of ``ph``) are the gaps'
    two forms: spread over the bytes, or fixed; ``dropped`` columns carry nothing. Returns v
    (bytes) and T (ns)."""
    n, ne = col.size, len(ph.entry)
    cap = np.array([lk.gbs for lk in topo.graph.links])  # B/ns
    scale = float(col.volume.max())
    pair_of = np.asarray(col.pair_of)
    links = col.links.tocsr()
    crossed = np.flatnonzero(links.getnnz(axis=1))
    root = root_links(topo)
    exclusive, shared = crossed[root[crossed]], crossed[~root[crossed]]
    limited = np.flatnonzero(col.rate < _slowest(col, cap) * (1 - 1e-9))
    limited = limited[~np.isin(limited, ph.entry)]
    fixed = np.zeros(n)  # ns: each entry column's held gap
    fixed[ph.entry] = held
    busy = np.zeros(n)  # ns per byte on its own route and its root-complex links
    busy[ph.entry] = 1.0 / col.rate[ph.entry] + charge[ph.entry]
    to_share = scipy.sparse.diags(scale / cap[shared]) @ links[shared]
    blocks = [
        scipy.sparse.csr_matrix((scale * busy[ph.entry], (np.arange(ne), ph.entry)), shape=(ne, n)),
        scipy.sparse.csr_matrix(
            (scale / col.rate[limited], (np.arange(len(limited)), limited)),
            shape=(len(limited), n),
        ),
        links[exclusive] @ scipy.sparse.diags(scale * busy),
        to_share,
    ]
    rhs = [-held, np.zeros(len(limited)), -(links[exclusive] @ fixed), np.zeros(len(shared))]
    for ex in exclusive:  # a shared link holds the gaps of the entries through ``ex``
        through = (links[ex].toarray().ravel() > 0).astype(np.float64)
        spread = links[shared] @ scipy.sparse.diags(scale * charge * through)
        rows = np.flatnonzero((links[shared] @ scipy.sparse.diags(through)).getnnz(axis=1))
        blocks.append(to_share[rows] + spread[rows])
        rhs.append(-(links[shared] @ (fixed * through))[rows])
    a_ub = scipy.sparse.vstack(blocks).tocsr()
    a_ub = scipy.sparse.hstack([a_ub, -np.ones((a_ub.shape[0], 1))])
    a_eq = scipy.sparse.csr_matrix(
        (np.ones(n), (pair_of, np.arange(n))), shape=(len(col.pairs), n + 1)
    )
    upper = np.full(n + 1, np.inf)
    upper[dropped] = 0.0
    cost = np.zeros(n + 1)
    cost[-1] = 1.0
    lp = scipy.optimize.linprog(
        cost,
        A_ub=a_ub,
        b_ub=np.concatenate(rhs),
        A_eq=a_eq,
        b_eq=col.volume / scale,
        bounds=np.column_stack([np.zeros(n + 1), upper]),
        method="highs-ds",
    )
    if lp.status != 0:
        raise TopologyError(f"the phased plan's merged LP failed: {lp.message}")
    return lp.x[:n] * scale, float(lp.x[-1])


def entries_bound(
    col: Columns, ph: Phases, topo: Topology, gap: np.ndarray, keep: np.ndarray
) -> float:
    """A lower bound on Σ t_k of the phased LP over any colouring of the entries ``keep``
    (indices into ``ph.entry``; the others dropped), in ns: the merged LP (``_merged_lp``) with
    each of them holding its gap, as it does in its phase whatever its bytes."""
    held = np.zeros(len(ph.entry))
    held[keep] = gap[keep]
    dropped = np.delete(ph.entry, keep)
    return _merged_lp(col, ph, topo, np.zeros(col.size), held, dropped)[1]


def used_entries(
    col: Columns, ph: Phases, topo: Topology, gap: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Which root entries are worth their gaps (issue 31), and each one's duration y / bw + g
    (ns): the merged LP (``_merged_lp``) with each entry's fixed charge, its gap g on the
    root-complex links it time-divides and on the shared links it holds, linearised by dynamic
    slope scaling: an entry that carried y bytes in the previous LP pays g / y per byte (at first
    y = its pair's demand, the LP relaxation); one that carried less than ``PACED_MIN_BYTES`` is
    dropped, unless it is its pair's largest column. At most ``SLOPE_ROUNDS`` LPs, fewer once the
    entries kept repeat. Returns the indices (into ``ph.entry``) of the entries kept, and every
    entry's duration."""
    ne = len(ph.entry)
    pair_of = np.asarray(col.pair_of)
    seen = col.volume[pair_of[ph.entry]].astype(np.float64)  # bytes each entry last carried
    keep = np.arange(ne)
    v = np.zeros(col.size)
    for _ in range(SLOPE_ROUNDS):
        charge = np.zeros(col.size)  # ns per byte: the gap spread over the bytes last carried
        charge[ph.entry[keep]] = gap[keep] / seen[keep]
        dropped = np.delete(ph.entry, keep)
        v, _ = _merged_lp(col, ph, topo, charge, np.zeros(ne), dropped)
        largest = np.zeros(len(col.pairs))
        np.maximum.at(largest, pair_of, v)
        y = v[ph.entry]
        worth = (y >= PACED_MIN_BYTES) | (y >= largest[pair_of[ph.entry]])
        now = keep[worth[keep]]
        seen = np.maximum(y, 1.0)
        done = np.array_equal(now, keep)
        keep = now
        if done:
            break
    return keep, v[ph.entry] / col.rate[ph.entry] + gap


def colour_by_duration(ph: Phases, keep: np.ndarray, duration: np.ndarray) -> Phases:
    """The entries ``keep`` (indices into ``ph.entry``) coloured first fit by decreasing
    ``duration`` (ties by column), so that the longest entries of disjoint root-complex links
    share a phase (issue 31)."""
    phase = np.empty(len(keep), dtype=np.int64)
    taken: list[set[int]] = []
    for n in sorted(range(len(keep)), key=lambda n: (-duration[keep[n]], ph.entry[keep[n]])):
        hit = ph.root_of[keep[n]]
        k = next((k for k, used in enumerate(taken) if not used & hit), len(taken))
        if k == len(taken):
            taken.append(set())
        taken[k] |= hit
        phase[n] = k
    return Phases(ph.entry[keep], phase, len(taken), [ph.root_of[e] for e in keep])


@dataclasses.dataclass(frozen=True)
class PhaseLP:
    """The phased LP's solution for one colouring: Σ t_k and its pieces in whole bytes."""

    span_ns: float  # Σ_k t_k
    phases: int  # K
    piece_col: np.ndarray  # every piece's column
    piece_phase: np.ndarray  # and phase
    nbytes: np.ndarray  # and whole bytes
    entry_bytes: np.ndarray  # per root entry of the colouring, its bytes (LP value)


def phase_lp(col: Columns, ph: Phases, topo: Topology, gap: np.ndarray) -> PhaseLP:
    """The phased LP over the colouring ``ph`` (``gap``: per root entry, ns). A column crossing a
    root-complex link but not among ``ph``'s entries carries nothing (it is dropped); every pair
    must keep a column."""
    K = max(ph.count, 1)
    free = np.flatnonzero(col.links[root_links(topo)].getnnz(axis=0) == 0)  # one variable per phase
    nf, ne = len(free), len(ph.entry)
    cap = np.array([lk.gbs for lk in topo.graph.links])  # GB/s = B/ns
    # bytes in units of the largest pair, t_k in units of its time on the fastest link (ns): the
    # coefficients stay near 1 at any volume (HiGHS drops matrix entries under 1e-9)
    scale, fastest = float(col.volume.max()), cap.max()
    unit_ns = scale / fastest
    used = np.flatnonzero(col.links.getnnz(axis=1))
    nu = len(used)
    lf = col.links[used][:, free]
    le = col.links[used][:, ph.entry].tocoo()
    # per (phase, link): the largest gap of the phase's root entries crossing the link
    link_gap = np.zeros(K * nu)
    np.maximum.at(link_gap, ph.phase[le.col] * nu + le.row, gap[le.col])
    eye_k = scipy.sparse.identity(K, format="csr")
    # variables: x (K blocks of nf, phase-major), y (ne), t (K); rows: links, caps (≤), pairs (=)
    link_rows = scipy.sparse.hstack(
        [
            scipy.sparse.kron(eye_k, lf),
            scipy.sparse.csr_matrix(
                (le.data, (ph.phase[le.col] * nu + le.row, le.col)), shape=(K * nu, ne)
            ),
            scipy.sparse.kron(eye_k, scipy.sparse.csr_matrix(-cap[used, None] / fastest)),
        ]
    )
    link_rhs = -np.tile(cap[used], K) * link_gap / scale
    # a column's rate cap binds only below its slowest link (efficiency < 1, measured rates)
    cf = np.flatnonzero(np.tile((col.rate < _slowest(col, cap) * (1 - 1e-9))[free], K))
    free_caps = scipy.sparse.hstack(
        [
            scipy.sparse.identity(K * nf, format="csr")[cf],
            scipy.sparse.csr_matrix((len(cf), ne)),
            scipy.sparse.kron(
                eye_k, scipy.sparse.csr_matrix(-col.rate[free, None] / fastest)
            ).tocsr()[cf],
        ]
    )
    entry_rate = col.rate[ph.entry]
    entry_caps = scipy.sparse.hstack(
        [
            scipy.sparse.csr_matrix((ne, K * nf)),
            scipy.sparse.identity(ne),
            scipy.sparse.csr_matrix(
                (-entry_rate / fastest, (np.arange(ne), ph.phase)), shape=(ne, K)
            ),
        ]
    )
    pair_of = np.asarray(col.pair_of)
    n_pairs = len(col.pairs)
    a_eq = scipy.sparse.hstack(
        [
            scipy.sparse.csr_matrix(
                (np.ones(K * nf), (np.tile(pair_of[free], K), np.arange(K * nf))),
                shape=(n_pairs, K * nf),
            ),
            scipy.sparse.csr_matrix(
                (np.ones(ne), (pair_of[ph.entry], np.arange(ne))), shape=(n_pairs, ne)
            ),
            scipy.sparse.csr_matrix((n_pairs, K)),
        ]
    )
    cost = np.zeros(K * nf + ne + K)
    cost[-K:] = 1.0
    sol = _solve(
        cost,
        scipy.sparse.vstack([link_rows, free_caps, entry_caps]),
        np.concatenate([link_rhs, np.zeros(len(cf)), -entry_rate * gap / scale]),
        a_eq,
        col.volume / scale,
        "phased",
    )
    # pieces: (column, phase) for every variable, rounded to whole bytes pair by pair
    piece_col = np.concatenate([np.tile(free, K), ph.entry])
    piece_phase = np.concatenate([np.repeat(np.arange(K), nf), ph.phase])
    order = np.argsort(pair_of[piece_col], kind="stable")
    nbytes = np.empty(len(piece_col), dtype=np.int64)
    nbytes[order] = whole_bytes(
        sol[: K * nf + ne][order] * scale, list(pair_of[piece_col][order]), col.volume
    )
    return PhaseLP(
        float(sol[-K:].sum()) * unit_ns,
        K,
        piece_col,
        piece_phase,
        nbytes,
        sol[K * nf : K * nf + ne] * scale,
    )


def _gaps(col: Columns, ph: Phases, topo: Topology, network: NetworkModel) -> np.ndarray:
    """Per root entry, in ns: from its last byte to the next phase's first, o + L + σ."""
    nic = through_nic(topo)
    inc = col.links.tocsc()
    out = np.empty(len(ph.entry))
    for e, c in enumerate(ph.entry):
        lids = inc.indices[inc.indptr[c] : inc.indptr[c + 1]]
        latency = network.latency_net_s if nic[lids].any() else network.latency_pcie_s
        out[e] = (network.issue_s + latency + network.signal_s) * 1e9
    return out


def _emit_phases(
    model: PathModel,
    col: Columns,
    ph: Phases,
    K: int,
    piece_col: np.ndarray,
    piece_phase: np.ndarray,
    nbytes: np.ndarray,
    gap: np.ndarray,
    lambda_s: float,
) -> Schedule:
    """The phased schedule. A node's clock ticks where one of its phases has a root entry: the
    entry's end (plus σ) starts the node's next *window* of phases, and the phases between two
    ticks form one window. Every piece waits for the root entries of the tick before its window
    on its sender's node (a root entry: on each of its nodes) and is paced to end with the window
    (a root entry ``gap`` earlier); a column's pieces of one window run as one transfer, and so
    do its transfers of consecutive windows within ``MERGE_REL`` of one rate. One step per window
    start; its root entries post first, then its pieces fastest first."""
    topo = model.topology
    g = topo.graph
    cap = np.array([lk.gbs for lk in g.links])
    entry_of = {int(c): e for e, c in enumerate(ph.entry)}
    live = nbytes > 0
    inc = col.links.tocsc()
    node_of_link = np.array([g.node_of[lk.src] for lk in g.links])
    # each phase's length after rounding: its slowest link or column, gaps included
    span = np.zeros(K)
    for k in range(K):
        mine = np.flatnonzero((piece_phase == k) & live)
        if not len(mine):
            continue
        x = np.zeros(col.size)
        x[piece_col[mine]] = nbytes[mine]
        link_gap = np.zeros(len(cap))
        need = nbytes[mine] / col.rate[piece_col[mine]]
        for p in mine:
            e = entry_of.get(int(piece_col[p]))
            if e is not None:
                c = int(piece_col[p])
                lids = inc.indices[inc.indptr[c] : inc.indptr[c + 1]]
                link_gap[lids] = np.maximum(link_gap[lids], gap[e])
                need = np.append(need, nbytes[p] / col.rate[c] + gap[e])
        span[k] = max(float((col.links @ x / cap + link_gap).max()), float(need.max()))
    span *= 1 + 1e-6  # caps sum strictly within every capacity after float rounding
    ends = np.concatenate([[0.0], np.cumsum(span)])  # planned phase boundaries
    # the nodes of every piece, and every node's ticks
    nodes_of: dict[int, tuple[int, ...]] = {}
    for c in set(piece_col[live].tolist()):
        e = entry_of.get(c)
        sites = {int(node_of_link[lid]) for lid in ph.root_of[e]} if e is not None else set()
        nodes_of[c] = tuple(sorted(sites or {int(g.node_of[g.gpus[col.pieces[c][0]]])}))
    ticks: dict[int, set[int]] = {}
    for p in np.flatnonzero(live):
        c = int(piece_col[p])
        if c in entry_of:
            for node in nodes_of[c]:
                ticks.setdefault(node, set()).add(int(piece_phase[p]))

    def window_start(node: int, k: int) -> int:
        return max((t + 1 for t in ticks.get(node, ()) if t < k), default=0)

    # per column: transfers as [start phase, bytes, rate, last phase]
    runs: dict[int, list[list]] = {}
    for p in np.lexsort((piece_phase, piece_col)):
        if not live[p]:
            continue
        c, k, x = int(piece_col[p]), int(piece_phase[p]), int(nbytes[p])
        a = max(window_start(node, k) for node in nodes_of[c])
        e = entry_of.get(c)
        if e is not None:  # the last phase of its window: ends gap before the window does
            runs.setdefault(c, []).append([a, x, x / (ends[k + 1] - ends[a] - gap[e]), k])
            continue
        b = min((t for t in ticks.get(nodes_of[c][0], ()) if t >= k), default=K - 1)
        mine = runs.setdefault(c, [])
        if mine and mine[-1][0] == a:  # the same window
            mine[-1][1] += x
        else:
            mine.append([a, x, 0.0, b])
        run = mine[-1]
        run[2] = run[1] / (ends[run[3] + 1] - ends[run[0]])
    for c, mine in runs.items():  # consecutive windows at one rate: one transfer
        if c in entry_of:
            continue
        merged = [mine[0]]
        for run in mine[1:]:
            last = merged[-1]
            if run[0] == last[3] + 1 and abs(run[2] - last[2]) <= MERGE_REL * run[2]:
                last[1] += run[1]
                last[3] = run[3]
                last[2] = last[1] / (ends[last[3] + 1] - ends[last[0]])
            else:
                merged.append(run)
        runs[c] = merged
    by_phase: list[list[tuple[int, int, float]]] = [[] for _ in range(K)]
    for c, mine in runs.items():
        for a, x, rate, _ in mine:
            by_phase[a].append((c, x, rate))
    steps: list[list[Transfer]] = [[] for _ in range(K)]
    tick_refs: dict[tuple[int, int], list[tuple[int, int]]] = {}  # (node, phase) -> its entries
    for a in range(K):
        by_phase[a].sort(key=lambda p: (p[0] not in entry_of, -p[2], p[0]))
        for c, x, rate in by_phase[a]:
            i, j, r = col.pieces[c]
            after = set()
            for node in nodes_of[c]:
                start = window_start(node, a if c not in entry_of else int(ph.phase[entry_of[c]]))
                after.update(tick_refs.get((node, start - 1), ()))
            if c in entry_of:
                for node in nodes_of[c]:
                    tick_refs.setdefault((node, int(ph.phase[entry_of[c]])), []).append(
                        (a, len(steps[a]))
                    )
            t = transfer(model, i, j, r, x)
            steps[a].append(
                dataclasses.replace(t, rate=min(r.rate, rate), after=tuple(sorted(after)))
            )
    # the first step starts after the call's one barrier (λ); every transfer of a later step waits
    # for signals from earlier ones, so those steps pay no barrier of their own
    out = [Step(tuple(ts), deps=(), overhead=None if a == 0 else 0.0) for a, ts in enumerate(steps)]
    meta = {**_meta("phased", K), "phases": K, "span_s": float(span.sum()) * 1e-9}
    return Schedule(topo.num_ranks, out, topo.fingerprint, lambda_s, "general", meta)


CHAIN_RATES = (
    8.0,
    12.0,
    16.0,
    24.0,
    32.0,
    48.0,
    64.0,
)  # GB/s: the reserved rates ``chained`` tries


def chained(
    model: PathModel,
    demand: np.ndarray,
    lambda_s: float,
    network: NetworkModel = PCIE,
    floor_s: float = 0.0,
) -> Schedule:
    """The chained hybrid plan (module docstring): the root entries of every root-complex link one
    after another, chained by signals, each paced at a reserved rate r; every other column paced
    once over the whole horizon on what the reservation leaves. For each r of ``CHAIN_RATES``
    (capped by the entries' rates), largest first, the split is solved online
    (:func:`chain_problem`, the paced split's mirror prox, warm-started from the previous rate's
    fractions and link weights) and the plan's time taken exactly (:func:`chain_time`), until a
    rate's plan is no faster than the best so far, or until the best is within ``SPLIT_TOLERANCE``
    of ``floor_s``, a data time (s) no plan over the same routes beats (the paced split's bound):
    no further rate could save more than that. The best wins. (On the 12 points of an ad-hoc
    sweep, r5080-bf3, r5080-cx8 and l20-cx7 MoE and Zipf, no rate the first stop skips was better
    than the best of those tried, though the time over the rates was not always monotone past
    it.)"""
    topo = model.topology
    col = route_columns(model, demand)
    if not col.size:
        return Schedule(len(demand), [], topo.fingerprint, lambda_s, "general", _meta("chained", 0))
    ph = colour(col, topo)
    if not len(ph.entry):  # nothing crosses a root complex: paced over the same routes
        raise TopologyError("the chained plan needs a root entry: without one it is paced")
    cap = np.array([lk.gbs for lk in topo.graph.links])
    gap = _gaps(col, ph, topo, network)
    held = _concurrent_entries(col, ph, len(cap))
    slot, slot_group = _slots(ph)
    best: tuple[float, float, np.ndarray] | None = None
    top = float(col.rate[ph.entry].max()) if len(ph.entry) else 0.0
    warm = None  # each rate's split starts from the previous rate's (the same columns)
    for rate in sorted({min(r, top) for r in CHAIN_RATES}, reverse=True):
        agg = chain_problem(col, ph, cap, gap, held, slot, slot_group, rate)
        if agg is None:  # this reservation leaves some link no room
            continue
        warm = _chain_split(agg, warm)
        nbytes = chain_bytes(col, agg, warm.frac)
        t = chain_time(col, ph, cap, gap, held, rate, nbytes)
        if best is not None and t >= best[0] * (1 - 1e-9):
            break  # slower than a larger rate's plan: the smaller rates are not tried
        best = (t, rate, nbytes)
        if t <= floor_s * 1e9 * (1 + SPLIT_TOLERANCE):
            break  # within the tolerance of the bound: no rate can save more
    if best is None:
        raise TopologyError("the chained plan has no reserved rate that leaves every link room")
    _, rate, nbytes = best
    return _emit_chains(model, col, ph, cap, held, rate, nbytes, lambda_s)


def _chain_split(agg: Aggregate, warm: Start | None) -> Start:
    """One rate's split (split.py's mirror prox) and its mean link weights: cold for the first
    rate, then from the previous rate's fractions and weights (``WARM_ITERATIONS`` at most)."""
    if not len(agg.col_pair):
        return Start(np.zeros(0), uniform_weight(agg))
    if warm is None:
        frac, weight = initial_fractions(agg), uniform_weight(agg)
        found = mirror_prox(agg, frac, weight, SPLIT_ITERATIONS, 0.0, SPLIT_TOLERANCE)
    else:
        found = mirror_prox(agg, warm.frac, warm.weight, WARM_ITERATIONS, 0.0, SPLIT_TOLERANCE)
    return Start(found.frac, found.weight)


def _concurrent_entries(col: Columns, ph: Phases, n_links: int) -> np.ndarray:
    """Per link, an upper bound on how many root entries cross it at once: the size of a
    (greedy) set of root-complex links that every entry crossing it uses one of, since each of
    those carries one entry at a time."""
    inc = col.links.tocsc()
    crossing: dict[int, list[int]] = {}
    for e, c in enumerate(ph.entry):
        for lid in inc.indices[inc.indptr[c] : inc.indptr[c + 1]]:
            crossing.setdefault(int(lid), []).append(e)
    out = np.zeros(n_links, dtype=np.int64)
    for lid, entries in crossing.items():
        left = [ph.root_of[e] for e in entries]
        while left:
            counts: dict[int, int] = {}
            for hit in left:
                for root in hit:
                    counts[root] = counts.get(root, 0) + 1
            pick = min(counts, key=lambda root: (-counts[root], root))
            left = [hit for hit in left if pick not in hit]
            out[lid] += 1
    return out


def _slots(ph: Phases) -> tuple[np.ndarray, np.ndarray]:
    """Per root entry, the index of its (group, phase) slot, groups being the connected
    components of entries that share a root-complex link, numbered by their first entry, and
    slots by (group, phase); and per slot, its group."""
    parent = list(range(len(ph.entry)))

    def find(e: int) -> int:
        while parent[e] != e:
            parent[e] = parent[parent[e]]
            e = parent[e]
        return e

    first: dict[int, int] = {}
    for e, hit in enumerate(ph.root_of):
        for lid in sorted(hit):
            if lid in first:
                parent[find(e)] = find(first[lid])
            else:
                first[lid] = e
    group_of_root: dict[int, int] = {}  # a component's root -> its number, by first entry
    for e in range(len(ph.entry)):
        group_of_root.setdefault(find(e), len(group_of_root))
    keys = [(group_of_root[find(e)], int(ph.phase[e])) for e in range(len(ph.entry))]
    slots = sorted(set(keys))
    index = {key: k for k, key in enumerate(slots)}
    return (
        np.array([index[key] for key in keys], dtype=np.int64),
        np.array([g for g, _ in slots], dtype=np.int64),
    )


def chain_problem(
    col: Columns,
    ph: Phases,
    cap: np.ndarray,
    gap: np.ndarray,
    held: np.ndarray,
    slot: np.ndarray,
    slot_group: np.ndarray,
    rate: float,
) -> Aggregate | None:
    """The chained plan's split at reserved rate ``rate`` (GB/s) as the paced split's min-max
    problem (:class:`~variopath_jax.planner.split.Aggregate`), over rank pairs and these
    resources:

    - every link a non-root column crosses, with what the reservation leaves, C_l - r held_l;
    - every column whose route runs below its slowest link: its own rate cap;
    - every group of root entries (``_slots``): its chain, at rate r, with fixed load the gaps
      of its slots; a root entry adds its bytes over its slot's size (a slot's entries run side
      by side, so the chain is estimated by their mean, and :func:`chain_time` takes it exactly).

    None when the reservation leaves a link that a non-root column crosses no room."""
    n_links = len(cap)
    left = cap * 1e9 - rate * 1e9 * held  # B/s, as the C++ core computes it
    is_entry = np.zeros(col.size, dtype=bool)
    is_entry[ph.entry] = True
    inc = col.links.tocsc()
    crossed = np.flatnonzero(col.links[:, np.flatnonzero(~is_entry)].getnnz(axis=1))
    if (left[crossed] <= 0).any() or (len(ph.entry) and rate <= 0):
        return None
    limited = (col.rate < _slowest(col, cap) * (1 - 1e-9)) & ~is_entry
    slot_size = np.bincount(slot) if len(slot) else np.zeros(0, dtype=np.int64)
    n_groups = int(slot_group.max()) + 1 if len(slot_group) else 0
    cap_index = np.full(col.size, -1, dtype=np.int64)
    cap_index[limited] = n_links + np.arange(int(limited.sum()))
    chain0 = n_links + int(limited.sum())
    entry_of = {int(c): e for e, c in enumerate(ph.entry)}
    res_cap = np.concatenate([left, col.rate[limited] * 1e9, np.full(n_groups, rate * 1e9)])
    base = np.zeros(len(res_cap))
    slot_gap = np.zeros(len(slot_size))
    np.maximum.at(slot_gap, slot, gap)
    np.add.at(base, chain0 + slot_group, slot_gap * 1e-9 * rate * 1e9)  # ns at r GB/s, in bytes
    pairs, routes, choice = [], [], []
    col_pair, col_ptr, col_res, col_coef = [], [0], [], []
    first = np.searchsorted(col.pair_of, np.arange(len(col.pairs)))
    for p, lo in enumerate(first):
        hi = int(first[p + 1]) if p + 1 < len(first) else col.size
        pairs.append(col.pairs[p])
        routes.append(tuple(col.pieces[c][2] for c in range(lo, hi)))
        for c in range(int(lo), hi):
            e = entry_of.get(c)
            if e is not None:
                res, coef = [chain0 + int(slot_group[slot[e]])], [1.0 / slot_size[slot[e]]]
            else:
                lids = inc.indices[inc.indptr[c] : inc.indptr[c + 1]]
                res = [int(lid) for lid in lids] + ([int(cap_index[c])] if limited[c] else [])
                coef = [1.0] * len(res)
            if hi - lo == 1:
                np.add.at(base, res, np.asarray(coef) * float(col.volume[p]))
                continue
            if c == lo:
                choice.append(p)
            col_pair.append(p)
            col_res.extend(res)
            col_coef.extend(coef)
            col_ptr.append(len(col_res))
    return Aggregate(
        pairs,
        routes,
        col.volume.astype(np.float64),
        base,
        res_cap,
        np.array(choice, dtype=np.int64),
        np.array(col_pair, dtype=np.int64),
        np.array(col_ptr, dtype=np.int64),
        np.array(col_res, dtype=np.int64),
        np.array(col_coef, dtype=np.float64),
    )


def chain_bytes(col: Columns, agg: Aggregate, frac: np.ndarray) -> np.ndarray:
    """Every column's whole bytes under the split ``frac`` of ``agg`` (pairs with one column:
    all of it), rounded pair by pair (``whole_bytes``)."""
    x = col.volume.astype(np.float64)[np.asarray(col.pair_of)].copy()
    chosen = np.isin(np.asarray(col.pair_of), agg.choice)
    x[chosen] = agg.volume[agg.col_pair] * frac
    return whole_bytes(x, col.pair_of, col.volume)


def chain_time(
    col: Columns,
    ph: Phases,
    cap: np.ndarray,
    gap: np.ndarray,
    held: np.ndarray,
    rate: float,
    nbytes: np.ndarray,
) -> float:
    """The chained plan's data time (ns) for this split, as ``_emit_chains`` lays it out: the
    non-root columns' horizon, or the longest chain of root entries (each entry y / r + its gap
    after the latest entry before it on one of its root-complex links), whichever is longer."""
    free = np.ones(col.size, dtype=bool)
    free[ph.entry] = False
    horizon = _free_horizon(col, cap, held, rate, np.where(free, nbytes, 0))
    ready: dict[int, float] = {}  # root-complex link -> when its latest entry ends
    longest = 0.0
    for e in sorted(range(len(ph.entry)), key=lambda e: (ph.phase[e], ph.entry[e])):
        c = int(ph.entry[e])
        if nbytes[c] <= 0:
            continue
        end = max((ready.get(lid, 0.0) for lid in ph.root_of[e]), default=0.0)
        end += nbytes[c] / min(float(col.rate[c]), rate) + gap[e]
        for lid in ph.root_of[e]:
            ready[lid] = end
        longest = max(longest, end)
    return max(horizon, longest)


def _free_horizon(
    col: Columns, cap: np.ndarray, held: np.ndarray, rate: float, x: np.ndarray
) -> float:
    """When the non-root columns' bytes ``x`` end, paced on what the reservation leaves (ns)."""
    left = cap * 1e9 - rate * 1e9 * held  # B/s, as the C++ core computes it
    with np.errstate(divide="ignore", invalid="ignore"):
        horizon = np.nanmax(np.where(left > 0, col.links @ x / left, 0.0)) * 1e9
    moving = x > 0
    return max(float(horizon), float((x[moving] / col.rate[moving]).max(initial=0.0)))


def _emit_chains(
    model: PathModel,
    col: Columns,
    ph: Phases,
    cap: np.ndarray,
    held: np.ndarray,
    rate: float,
    nbytes: np.ndarray,
    lambda_s: float,
) -> Schedule:
    """One step: every free column paced to end with the slowest link's share, the root entries in
    phase order, each waiting for the previous entry on each of its root-complex links."""
    topo = model.topology
    entry_of = {int(c): e for e, c in enumerate(ph.entry)}
    free = np.array([c for c in range(col.size) if c not in entry_of and nbytes[c] > 0], int)
    x = np.zeros(col.size)
    x[free] = nbytes[free]
    horizon = _free_horizon(col, cap, held, rate, x)
    horizon *= 1 + 1e-6  # caps sum strictly within every capacity after float rounding
    transfers: list[Transfer] = []
    for c in free:
        i, j, r = col.pieces[c]
        t = transfer(model, i, j, r, int(nbytes[c]))
        transfers.append(dataclasses.replace(t, rate=min(r.rate, nbytes[c] / horizon)))
    previous: dict[int, tuple[int, int]] = {}  # root-complex link -> its latest entry
    for e in sorted(range(len(ph.entry)), key=lambda e: (ph.phase[e], ph.entry[e])):
        c = int(ph.entry[e])
        if nbytes[c] <= 0:
            continue
        i, j, r = col.pieces[c]
        after = tuple(sorted({previous[lid] for lid in ph.root_of[e] if lid in previous}))
        t = transfer(model, i, j, r, int(nbytes[c]))
        for lid in ph.root_of[e]:
            previous[lid] = (0, len(transfers))
        transfers.append(dataclasses.replace(t, rate=min(r.rate, rate), after=after))
    meta = {**_meta("chained", 1), "reserved_gbs": rate}
    return Schedule(
        topo.num_ranks, [Step(tuple(transfers))], topo.fingerprint, lambda_s, "general", meta
    )


# The phased LP has one variable per (non-root column, phase). HiGHS solves 4,400 of them
# (r5080-bf3 x 2) in 0.2-0.3 s, 16,600 (r5080-bf3 x 4) in 1.7 s and 66,600 (x 8) in 18-28 s on a
# shared 2-core machine; planning is on the critical path of every call, so ``hybrid_candidates``
# leaves the plan out past this many (``chained``, whose LP has one variable per column, stays).
PHASED_MAX_VARIABLES = 8_000


def phased_variables(model: PathModel, demand: np.ndarray) -> int:
    """The number of piece variables the phased LP of this demand has."""
    col = route_columns(model, demand)
    ph = colour(col, model.topology)
    return max(ph.count, 1) * (col.size - len(ph.entry))


# What building ``phased`` costs (its colouring, its LPs by HiGHS, its schedule), measured by
# ``python benchmarks/bench_planner.py phased`` on this project's shared 2-core machine
# (2026-12-06): 25-415 ms on r5080-bf3 x 1 and 2, r5090-bf3 x 1 and r5080-cx8 x 1 (816-4,352
# variables) for MoE M = 128, Zipf 0.6 at 1 GiB and uniform 32 MiB per rank, 31-134 µs per
# variable, but 1.4-1.7 s (1.46 ms per variable) for uniform 16 GiB on r5080-bf3 x 1, where
# HiGHS's interior point takes 661 iterations. The gate (``model_aware.phased_pays``) counts it
# from above of every measured build, PHASED_S_PER_VARIABLE per variable; sizing the LP costs
# 1-12 ms itself, so the gate first asks whether even PHASED_LEAST_S (under the least measured,
# for a faster machine) could pay.
PHASED_S_PER_VARIABLE = 2e-3
PHASED_LEAST_S = 20e-3


@dataclasses.dataclass(frozen=True)
class PhasedShape:
    """What ``phased``'s LP size takes from the topology, per rank pair (flattened ``i n + j``):
    ``free``, how many of its columns (``route_columns``) cross no root-complex link (its piece
    variables per phase), and ``root``, per root-complex link the columns crossing it (links ×
    pairs; a link's entries take a phase each)."""

    free: np.ndarray
    root: scipy.sparse.csr_matrix


@functools.lru_cache(maxsize=16)
def phased_shape(model: PathModel) -> PhasedShape:
    """The deployment's ``PhasedShape``, counted once, for the uniform demand."""
    col = route_columns(model, uniform_demand(model))
    n = model.topology.num_ranks
    pairs = np.asarray(col.pairs)[np.asarray(col.pair_of)]
    pair = pairs[:, 0] * n + pairs[:, 1]
    on_root = col.links[root_links(model.topology)]  # root-complex links × columns
    crossing = on_root.tocoo()
    free = np.zeros(n * n, dtype=np.int64)
    np.add.at(free, pair, np.asarray(on_root.getnnz(axis=0)) == 0)
    root = scipy.sparse.csr_matrix(
        (np.ones(crossing.nnz), (crossing.row, pair[crossing.col])),
        shape=(crossing.shape[0], n * n),
    )
    return PhasedShape(free, root)


def phased_variables_bound(model: PathModel, demand: np.ndarray) -> int:
    """A lower bound on ``phased_variables`` in tens of microseconds (the sizing itself takes
    milliseconds): the demand's free columns times the most of its columns crossing one
    root-complex link (each takes a phase of its own)."""
    shape = phased_shape(model)
    used = (np.asarray(demand) > 0).ravel()
    phases = max(1, int((shape.root @ used.astype(np.float64)).max(initial=0)))
    return phases * int(shape.free[used].sum())


def phased_work_s(model: PathModel, demand: np.ndarray) -> float:
    """The planning ``phased`` is expected to cost for ``demand`` (seconds, from above: its LP's
    variables times ``PHASED_S_PER_VARIABLE``; infinite past ``PHASED_MAX_VARIABLES``, where it
    is never built). ``phased_variables_bound`` decides a large LP without sizing it
    (``route_columns`` costs 30-40 ms at 64 GPUs)."""
    if phased_variables_bound(model, demand) > PHASED_MAX_VARIABLES:
        return math.inf
    variables = phased_variables(model, demand)
    return math.inf if variables > PHASED_MAX_VARIABLES else variables * PHASED_S_PER_VARIABLE


# What building ``chained`` costs per column and mirror-prox iteration at the iteration caps
# (SPLIT_ITERATIONS, then WARM_ITERATIONS for each further rate): the most measured over the 16
# points of ``python benchmarks/bench_planner.py chained`` (ffi/chained.cc on this project's
# shared 2-core machine, 2026-12-06: r5080-bf3 x 1 and x 2, l20-cx7 x 1 and x 2, Zipf 0.6 at 64
# MiB and 1 GiB per rank, MoE M = 128 and 1024: 6.5-37.1 ns, the most on r5080-bf3 x 1, MoE
# M = 128), with some room for a busier machine, so the estimate is at least every measured cost:
# planning is on the call's critical path, and the gate takes the side of counting it. (The
# earlier 20 ns, from one point, was under the measured cost on 6 of the 16 and let ``chained``
# spend 6-8 ms on l20-cx7 x 1 Zipf 1 GiB for a plan that lost to ``staged``.)
CHAINED_S_PER_COLUMN_ITERATION = 42e-9


def chained_columns(model: PathModel, demand: np.ndarray) -> int:
    """The columns ``chained``'s split has for ``demand``: per rank pair with demand, its
    candidate routes (at most ``PACED_ROUTES``)."""
    group_of = np.asarray(model.group_of)
    return sum(
        min(len(model.routes(int(group_of[i]), int(group_of[j]))), PACED_ROUTES)
        for i, j in zip(*np.nonzero(demand), strict=True)
    )


def chained_work_s(model: PathModel, demand: np.ndarray) -> float:
    """The planning time ``chained`` is expected to cost for ``demand`` (seconds, from its
    size: columns times iteration caps times ``CHAINED_S_PER_COLUMN_ITERATION``)."""
    iterations = SPLIT_ITERATIONS + (len(CHAIN_RATES) - 1) * WARM_ITERATIONS
    return chained_columns(model, demand) * iterations * CHAINED_S_PER_COLUMN_ITERATION


def gap_network(networks: tuple[NetworkModel, ...]) -> NetworkModel:
    """The model whose o + L + σ is largest (the first such): the hybrid plans' gaps take it."""
    return max(
        networks, key=lambda m: m.issue_s + max(m.latency_pcie_s, m.latency_net_s) + m.signal_s
    )


def hybrid_candidates(
    req: PlanRequest, plans: tuple[str, ...] = ("chained", "phased"), floor_s: float = 0.0
) -> dict[str, Schedule]:
    """The hybrid plans as candidates of ``variopath`` (``plan_model_aware``), in this order:
    ``chained`` where a root entry exists and some reserved rate leaves every link room,
    ``phased`` where its LP is small enough (``PHASED_MAX_VARIABLES``). Phase gaps take
    ``gap_network`` of the request's models. The C++ core builds ``chained`` itself
    (``plans=("phased",)`` then). ``floor_s``: the data bound ``chained`` may stop at."""
    network = gap_network(req.networks)
    out = {}
    if "chained" in plans:
        with contextlib.suppress(TopologyError):  # no reserved rate leaves room: left out
            out["chained"] = chained(req.model, req.demand, req.lambda_s, network, floor_s)
    if "phased" in plans and phased_variables(req.model, req.demand) <= PHASED_MAX_VARIABLES:
        out["phased"] = phased(req.model, req.demand, req.lambda_s, network)
    return out


def _meta(plan: str, activations: int) -> dict:
    return {"scheduler": "variopath", "activations": activations, "paced": True, "hybrid": plan}
