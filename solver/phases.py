"""The phase model of the hybrid MILP (:mod:`variopath_jax.solver.hybrid_milp`, issue 31;
research/hybrid-prototype.md): root-complex entries time-divided into phases, every other byte
paced within them, and ``phased``, its greedy point, which the MILP starts from and must beat.

No measurement shows that pacing saves concurrent transfers through a CPU root complex
(research/contention-evidence.md), so the conservative network model charges a root-complex
link by flow count whenever two or more flows cross it, paced or not. The phase model therefore
keeps every root-complex link to one flow at a time, the paper's own premise for a channel (§3:
each resource in U used by one lane), and paces everything else:

- **root entries**: a column (a pair's bytes on one candidate route) whose path crosses a
  root-complex link, coloured greedily into *phases* such that the entries of one phase cross
  pairwise disjoint root-complex links (paper §4.1's CANADD test on that subset of U).
- ``phased``: an LP over the phases, min Σ t_k  s.t. every pair split over its routes and
  phases (a root entry only in its own phase), every link's bytes of phase k at most C_l t_k,
  every column's at most bw t_k; each phase's pieces paced to end together, a root entry
  o + L + σ earlier. Phase boundaries are signals, no barrier. Each root entry a phase holds
  costs its gap there, so ``phased`` runs only the entries worth their gaps (``used_entries``),
  coloured by decreasing duration (``colour_by_duration``), unless the greedy colouring of every
  entry gives a shorter LP.

The op does not run ``phased``: its LP (HiGHS, 25 ms to 1.6 s) never paid for its planning, and
with planning free it beat the C++ core's families by at most 0.2% on the 49 points of
``benchmarks/bench_op_call.py`` (issue 51). It stays as the MILP's warm start, and
``_emit_phases`` emits the MILP's solutions as schedules.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import scipy.optimize
import scipy.sparse

from variopath_jax.errors import TopologyError
from variopath_jax.schedule import Schedule, Step, Transfer
from variopath_jax.schedulers import transfer
from variopath_jax.sim.network import LINK_CLASSES, PCIE, NetworkModel, link_classes, through_nic
from variopath_jax.topology import PathModel, Topology
from variopath_jax.topology.paths import Route

PACED_ROUTES = 4  # the most candidate routes a pair's bytes are split over (a column each)
PACED_MIN_BYTES = 4096  # a split piece smaller than this joins the pair's largest piece


@dataclasses.dataclass(frozen=True)
class Columns:
    """One LP column per (pair with demand, candidate route), pairs in row-major order.

    ``links`` is the (links × columns) incidence of the columns' full paths (endpoint links
    included); ``volume`` each pair's demand; ``rate`` each column's route rate (GB/s)."""

    pieces: list[tuple[int, int, Route]]
    pair_of: list[int]
    pairs: list[tuple[int, int]]
    volume: np.ndarray
    rate: np.ndarray
    links: scipy.sparse.csr_matrix

    @property
    def size(self) -> int:
        return len(self.pieces)


def route_columns(model: PathModel, demand: np.ndarray, per_pair: int = PACED_ROUTES) -> Columns:
    """Every pair with demand on each of its ``per_pair`` fastest candidate routes."""
    group_of = model.group_of
    pieces: list[tuple[int, int, Route]] = []
    rows, cols, pair_of = [], [], []
    pairs = [(int(i), int(j)) for i, j in zip(*np.nonzero(demand), strict=True)]
    for p, (i, j) in enumerate(pairs):
        routes = sorted(model.routes(int(group_of[i]), int(group_of[j])), key=lambda r: -r.rate)
        if not routes:
            raise TopologyError(f"no path from rank {i} to rank {j}, which have demand")
        for r in routes[:per_pair]:
            c = len(pieces)
            pieces.append((i, j, r))
            pair_of.append(p)
            for lid in model.path(i, j, r).links:
                rows.append(lid)
                cols.append(c)
    n_links = len(model.topology.graph.links)
    links = scipy.sparse.csr_matrix(
        (np.ones(len(rows)), (rows, cols)), shape=(n_links, len(pieces))
    )
    volume = np.array([demand[i, j] for i, j in pairs], dtype=np.int64)
    rate = np.array([r.rate for _, _, r in pieces], dtype=np.float64)
    return Columns(pieces, pair_of, pairs, volume, rate, links)


def whole_bytes(x: np.ndarray, pair_of: list[int], volume: np.ndarray) -> np.ndarray:
    """Each pair's LP split as whole bytes summing to its demand: pieces under
    ``PACED_MIN_BYTES`` (or under a millionth of the pair) join the pair's largest piece, the
    others are floored and the pair's largest piece takes the remainder. ``pair_of`` must be
    sorted (a pair's pieces contiguous)."""
    out = np.floor(x).astype(np.int64)
    first = np.searchsorted(pair_of, np.arange(len(volume)))
    for p, (lo, hi) in enumerate(zip(first, [*first[1:], len(x)], strict=True)):
        piece = out[lo:hi]
        piece[piece < max(PACED_MIN_BYTES, volume[p] // 1_000_000)] = 0
        top = lo + int(np.argmax(x[lo:hi]))
        out[top] += volume[p] - out[lo:hi].sum()
    return out


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


def _meta(plan: str, activations: int) -> dict:
    return {"scheduler": "variopath", "activations": activations, "paced": True, "hybrid": plan}
