"""The compact catalog: every realizable shape with its non-dominated rate profiles (§4.1).

Algorithm 2 reads a family only through its lanes' group pairs and rates: endpoint binding scores
h_ijr = min(D_ij/τ, bw(r)), and volumes and utility use bw(r) (paper Eq. 7-10). Two families of
one shape whose lanes have the same rates per group pair (the same *rate profile*) therefore
yield the same activations, and one of them suffices; a profile whose lanes, paired fastest first
within every group pair, are no faster than another's of the same shape and once slower is
*dominated* and never needed (PRUNEFAMILIES in rate form). Algorithm 1 enumerates every family
and explodes on richly connected nodes (16 GPUs with NICs and switch rings: millions of
families); this search visits rate profiles instead.

It is a DFS over the shape, one group pair (cell) at a time in (a, d) order, branching on the
cell's lane count within what the degrees left and SUFFIXOK allow. For the decided prefix of the
shape it carries the *alternatives*: every distinct rate profile of the prefix (lanes per rate
class in every cell, fastest class first) with the Pareto-minimal set of its concrete
realisations (*states*: the exclusive resources used, the NIC pool headroom left). Four
reductions keep it small, and none changes the result, which is exactly what the exhaustive
search with dominated profiles dropped at the end returns (``pruning="end"``; tested):

1. *Remaining resources only.* A state keeps only what the cells still to come can use under the
   degrees left: exclusive resources no open later cell touches are forgotten, and pool headroom
   is capped at what the open later cells can take. Realisations that leave the same remaining
   resources complete in the same ways, so they merge.
2. *Dominance during the search.* A state of prefix profile Q is dropped when a profile P of the
   same partial shape that dominates Q has a state leaving no fewer remaining resources: every
   completion S of Q then completes P, and P + S dominates Q + S. Done at every cell, this
   replaces the end-of-search pruning, which first had to enumerate every dominated profile.
3. *Reuse of recurring subtrees.* From the start of each of the last two group rows, what an
   alternative's subtree finds depends only on the degrees left and on its states up to a
   relabelling; it is searched once per such key, replayed, and the alternatives' findings are
   merged shape by shape (dominated profiles dropped, the first kept).
4. *The forced tail.* The last cells whose lane counts the degrees force and whose lanes have one
   rate (in a factored catalog: the lanes to and from the other nodes O) are taken in one step.

The order is the exhaustive search's: shapes in the order it first reaches them (by their first
profile in search order; so a state also stays while it may complete to its shape's first
profile, and rule 2 drops it for that purpose only when an earlier profile can complete in its
place), each shape's profiles in search order, and as the witness of a profile its realisation
with the fewest exclusive resources, then the fewest pool units, then the first in instance
order: the family the exhaustive search keeps.
"""

from __future__ import annotations

import gc
import itertools
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from variopath_jax.catalog.build import Family
from variopath_jax.catalog.instances import CatalogError, InstanceSet

Profile = tuple[
    tuple[int, int, tuple[tuple[float, int], ...]], ...
]  # ((a, d, ((rate, lanes), ...)), ...)

PRUNING = ("search", "end", "none")

_LIVE = 1  # a state's role: it may complete to a non-dominated profile
_FIRST = 2  # a state's role: it may complete to its shape's first profile in search order
_MEMO_ROWS = 2  # rule 3 applies from the start of each of the last this many group rows
_REPORT = 10_000  # profiles between progress reports

# A state: (exclusive resources used, packed pool headroom, exclusive resources used in all, pool
# units used in all, the chosen (instance, lanes) pairs, roles). Inside a replayed subtree the
# chosen pairs start with the rank of the state it grew from instead of that state's pairs.
_State = tuple[int, int, int, int, tuple, int]
_Alt = tuple[int, list[_State]]  # (packed prefix profile, its states: best witness first)
_Way = tuple[int, int, int, int, tuple]  # (mask, packed pool units, resources, units, pairs)
_Move = tuple[int, list[_Way]]  # (packed profile fields of one split, the ways to realise it)
_Selection = tuple[int, tuple, dict[int, int]]  # (mask, (instance, lanes) pairs, pool units)
# A shape found: (lanes of the cells from the subtree's first, first profile, (profile, witness)
# of every non-dominated profile).
_Record = tuple[tuple[int, ...], int, list[tuple[int, tuple]]]


@dataclass(frozen=True)
class _Cell:
    """One group pair: its rate classes (fastest first, with their instances) and the most lanes
    it can hold."""

    src: int
    dst: int
    classes: tuple[tuple[float, tuple[int, ...]], ...]
    most: int


@dataclass(frozen=True)
class _Fields:
    """Small non-negative integers packed into one int, ``width`` bits each (field 0 lowest),
    the top bit of every field kept clear as a guard, so that whole vectors compare and subtract
    at once: ``a >= b`` in every field exactly when ``((a | guard) - b) & guard == guard``."""

    width: int
    count: int

    @property
    def guard(self) -> int:
        top = 1 << (self.width - 1)
        return sum(top << (k * self.width) for k in range(self.count))

    def pack(self, values: list[int]) -> int:
        return sum(v << (k * self.width) for k, v in enumerate(values))

    def field(self, packed: int, k: int) -> int:
        return (packed >> (k * self.width)) & ((1 << self.width) - 1)


@dataclass
class CompactTree:
    """Shapes, and per shape its non-dominated rate profiles (every realizable one with
    ``pruning="none"``) with one witness family each, in search order."""

    shapes: np.ndarray  # (S, G, G) lanes per group pair
    families: list[Family]  # the witness of every profile, grouped by shape
    family_shape: np.ndarray  # the shape of every family
    codes: list[int]  # every profile, packed (``profile`` decodes it)
    cells: tuple[_Cell, ...]
    fields: _Fields  # the packing of ``codes``
    visited: int  # search nodes expanded
    reused: int  # subtrees replayed instead of searched
    seconds: float

    def profile(self, k: int) -> Profile:
        """Family ``k``'s rate profile: for every group pair with lanes, its lanes per rate."""
        f = self.fields.count
        out = []
        for cell in self.cells:
            cum = []
            for _ in cell.classes:
                f -= 1
                cum.append(self.fields.field(self.codes[k], f))
            if cum[-1]:
                lanes = [n - m for n, m in zip(cum, [0, *cum[:-1]], strict=True)]
                rates = tuple(
                    (rate, n) for (rate, _), n in zip(cell.classes, lanes, strict=True) if n
                )
                out.append((cell.src, cell.dst, rates))
        return tuple(out)

    def profiles_of(self, shape: int) -> list[Profile]:
        return [self.profile(int(k)) for k in np.flatnonzero(self.family_shape == shape)]


def enumerate_profiles(
    inst: InstanceSet,
    max_profiles: int = 5_000_000,
    progress: Callable[[int], None] | None = None,
    pruning: str = "search",
) -> CompactTree:
    """Every realizable shape of ``inst`` with its non-dominated rate profiles and one witness
    family each (see the module docstring).

    ``pruning`` is ``"search"`` (dominance inside the search: the default), ``"end"`` (the
    reference: an exhaustive search, dominated profiles dropped at the end) or ``"none"`` (every
    realizable profile). More than ``max_profiles`` profiles raise :class:`CatalogError` as soon
    as they are found; ``progress`` is called with the number found so far, every 10,000.
    """
    if pruning not in PRUNING:
        raise CatalogError(f"unknown pruning {pruning!r}; expected one of {PRUNING}")
    collecting = gc.isenabled()
    gc.disable()  # millions of small tuples and no reference cycle: collections only cost time
    try:
        tree = _Search(inst, pruning == "search", max_profiles, progress).run()
    finally:
        if collecting:
            gc.enable()
    return _prune_at_end(tree) if pruning == "end" else tree


def _prune_at_end(tree: CompactTree) -> CompactTree:
    """``tree`` (every realizable profile) with each shape's dominated profiles dropped."""
    keep = []
    for s in range(len(tree.shapes)):
        ks = [int(k) for k in np.flatnonzero(tree.family_shape == s)]
        keep += [ks[j] for j in prune_dominated_profiles([tree.profile(k) for k in ks])]
    return CompactTree(
        tree.shapes,
        [tree.families[k] for k in keep],
        tree.family_shape[keep],
        [tree.codes[k] for k in keep],
        tree.cells,
        tree.fields,
        tree.visited,
        tree.reused,
        tree.seconds,
    )


def lanes_of(profile: Profile) -> dict[tuple[int, int], list[float]]:
    """Per cell, the lane rates of a profile, fastest first."""
    return {
        (a, d): sorted((r for r, k in classes for _ in range(k)), reverse=True)
        for a, d, classes in profile
    }


def prune_dominated_profiles(profiles: list[Profile]) -> list[int]:
    """Indices of the profiles that no other profile of the same shape dominates (vectorised:
    profiles of one shape have the same lanes per cell, so each is a vector of lane rates in a
    common slot order). The end-of-search pruning of ``pruning="end"``."""
    if len(profiles) < 2:
        return list(range(len(profiles)))
    slots = [
        [r for cell in sorted(lanes) for r in lanes[cell]] for lanes in map(lanes_of, profiles)
    ]
    v = np.array(slots, dtype=np.float64)
    keep = []
    for k in range(len(v)):
        ge = (v >= v[k]).all(axis=1)
        gt = (v > v[k]).any(axis=1)
        if not (ge & gt).any():
            keep.append(k)
    return keep


def _cells(inst: InstanceSet) -> tuple[_Cell, ...]:
    """The cells in (a, d) order."""
    by_cell: dict[tuple[int, int], dict[float, list[int]]] = {}
    for it in inst.instances:
        by_cell.setdefault((it.src_group, it.dst_group), {}).setdefault(it.rate, []).append(
            it.index
        )
    cells = []
    for a, d in sorted(by_cell):
        classes = tuple(
            (rate, tuple(ids))
            for rate, ids in sorted(by_cell[(a, d)].items(), key=lambda kv: -kv[0])
        )
        lanes = sum(inst.instances[i].multiplicity for _, ids in classes for i in ids)
        cells.append(_Cell(a, d, classes, min(inst.group_size, lanes)))
    return tuple(cells)


class _Search:
    """The DFS of ``enumerate_profiles``, its tables and caches."""

    def __init__(
        self,
        inst: InstanceSet,
        prune: bool,
        max_profiles: int,
        progress: Callable[[int], None] | None,
    ) -> None:
        self.items = inst.instances
        self.pruning = prune  # rules 1-3 and dominance at COMPLETE, else every profile
        self.max_profiles = max_profiles
        self.progress = progress
        self.g = g = inst.group_size
        self.n_groups = n = inst.num_groups
        self.free = inst.free_group
        self.cells = cells = _cells(inst)
        self.capacity = [p.capacity for p in inst.pools]

        # degrees left, and SUFFIXOK's lanes the cells c.. can still add per group; O (the free
        # group) takes any number
        unbounded = 2 * g * n
        self.out_left, self.in_left = [g] * n, [g] * n
        self.suf_out = [[0] * n for _ in range(len(cells) + 1)]
        self.suf_in = [[0] * n for _ in range(len(cells) + 1)]
        for c in range(len(cells) - 1, -1, -1):
            self.suf_out[c] = self.suf_out[c + 1].copy()
            self.suf_in[c] = self.suf_in[c + 1].copy()
            self.suf_out[c][cells[c].src] += cells[c].most
            self.suf_in[c][cells[c].dst] += cells[c].most
        if self.free is not None:
            self.out_left[self.free] = self.in_left[self.free] = unbounded
            for row in (*self.suf_out, *self.suf_in):
                row[self.free] = unbounded
        # the bounded groups' degrees left as one number (a cache key), in base g + 1
        self.out_weight = [0 if x == self.free else (g + 1) ** x for x in range(n)]
        self.in_weight = [0 if x == self.free else (g + 1) ** (n + x) for x in range(n)]
        self.degrees = g * (sum(self.out_weight) + sum(self.in_weight))

        # pool headroom, packed; what each cell's instances can use (rule 1)
        self.pools = _Fields(max([1, *self.capacity]).bit_length() + 1, len(self.capacity))
        self.pool_guard = self.pools.guard
        self.cell_bits, self.cell_units = [], []
        for cell in cells:
            bits, units = 0, [0] * len(self.capacity)
            for _, ids in cell.classes:
                for i in ids:
                    bits |= self.items[i].mask
                    for p in self.items[i].pools:
                        units[p] += self.items[i].multiplicity
            self.cell_bits.append(bits)
            self.cell_units.append([(p, min(u, cell.most)) for p, u in enumerate(units) if u])
        self.everything = (1 << len(inst.resources)) - 1, self.pools.pack(self.capacity)

        # profiles, packed with cell 0's fields most significant, per cell and rate class the
        # lanes of that class and all faster ones: numeric order is search order, and within a
        # shape a profile dominates another exactly when no field of it is lower
        self.fields = _Fields(g.bit_length() + 1, sum(len(cell.classes) for cell in cells))
        self.rank_guard = self.fields.guard
        self.first_field = [0] * len(cells)  # the lowest field of every cell
        for c in range(len(cells) - 2, -1, -1):
            self.first_field[c] = self.first_field[c + 1] + len(cells[c + 1].classes)

        self.memo_at = self._memo_levels() if prune else set()
        self.tail_from = self._tail()
        self._selections: dict[tuple[tuple[int, ...], int], list[_Selection]] = {}
        self._moves: dict[tuple[int, int], list[_Move]] = {}
        self._relevance: dict[tuple[int, int], tuple[int, int]] = {}
        self._tails: dict[tuple[int, int], tuple[list[int], _Move] | None] = {}
        self.memo: dict[tuple, list[_Record]] = {}
        self.taken = [0] * len(cells)  # the lanes of every cell on the current path
        self.replaying = 0  # subtree searches for rule 3 under way
        self.visited = self.reused = self.found = 0

    def _memo_levels(self) -> set[int]:
        """Rule 3's cells: the first cells of the last ``_MEMO_ROWS`` group rows."""
        cells = self.cells
        starts = [c for c in range(1, len(cells)) if cells[c].src != cells[c - 1].src]
        return set(starts[-_MEMO_ROWS:])

    def _tail(self) -> int:
        """Rule 4: the first cell of the longest run of last cells each of which is the last of
        its bounded source row or destination column (so its lane count is forced) and has one
        rate class (so the run adds one profile)."""
        cells, start = self.cells, len(self.cells)
        while start:
            cell, later = cells[start - 1], cells[start:]
            last_in_row = cell.src != self.free and all(x.src != cell.src for x in later)
            last_in_col = cell.dst != self.free and all(x.dst != cell.dst for x in later)
            if len(cell.classes) > 1 or not (last_in_row or last_in_col):
                break
            start -= 1
        return start

    # ----- one cell's moves --------------------------------------------------------------------
    def _select(self, ids: tuple[int, ...], count: int) -> list[_Selection]:
        """Ways to put ``count`` lanes on the instances ``ids`` (one cell and rate): (exclusive
        mask, (instance, lanes) pairs, {pool: units}), masks pairwise disjoint."""
        key = (ids, count)
        if key in self._selections:
            return self._selections[key]
        out: list[_Selection] = []

        def rec(k: int, left: int, mask: int, pairs: tuple, pools: dict[int, int]) -> None:
            if left == 0:
                out.append((mask, pairs, pools))
                return
            if k == len(ids):
                return
            rec(k + 1, left, mask, pairs, pools)
            it = self.items[ids[k]]
            if it.mask & mask:
                return
            for lanes in range(1, min(it.multiplicity, left) + 1):
                more = dict(pools)
                for p in it.pools:
                    more[p] = more.get(p, 0) + lanes
                rec(k + 1, left - lanes, mask | it.mask, (*pairs, (ids[k], lanes)), more)

        rec(0, count, 0, (), {})
        self._selections[key] = out
        return out

    def moves(self, c: int, t: int) -> list[_Move]:
        """Per split of t lanes over cell c's rate classes, in search order: its packed profile
        fields and every way to realise it within pool capacity."""
        key = (c, t)
        if key in self._moves:
            return self._moves[key]
        cell = self.cells[c]
        out = []
        for split in _splits([len(ids) * self.g for _, ids in cell.classes], t):
            choice = [self._select(ids, k) for (_, ids), k in zip(cell.classes, split, strict=True)]
            ways = []
            for combo in itertools.product(*choice):
                mask, units, pairs = 0, [0] * len(self.capacity), ()
                for m, chosen, pools in combo:
                    if m & mask:
                        break
                    mask |= m
                    for p, u in pools.items():
                        units[p] += u
                    pairs += chosen
                else:
                    if all(u <= cap for u, cap in zip(units, self.capacity, strict=True)):
                        ways.append(
                            (mask, self.pools.pack(units), mask.bit_count(), sum(units), pairs)
                        )
            if ways:
                top = self.first_field[c] + len(split) - 1
                cum = itertools.accumulate(split)
                code = sum(k << ((top - j) * self.fields.width) for j, k in enumerate(cum))
                out.append((code, ways))
        self._moves[key] = out
        return out

    # ----- states ------------------------------------------------------------------------------
    def relevance(self, c: int) -> tuple[int, int]:
        """Rule 1: the exclusive resources the cells c.. can still use and, per pool, the most
        units they can still take (packed), under the degrees left. A cell whose group pair has
        no degree left is closed; a pool's units are bounded by its open cells, source row by
        source row (at most the lanes the group has left to send) and column by column."""
        if not self.pruning:
            return self.everything
        key = (c, self.degrees)
        if key in self._relevance:
            return self._relevance[key]
        out_left, in_left = self.out_left, self.in_left
        bits = 0
        rows = [[0] * self.n_groups for _ in self.capacity]
        cols = [[0] * self.n_groups for _ in self.capacity]
        for k in range(c, len(self.cells)):
            cell = self.cells[k]
            room = min(out_left[cell.src], in_left[cell.dst], cell.most)
            if room:
                bits |= self.cell_bits[k]
                for p, u in self.cell_units[k]:
                    rows[p][cell.src] += min(u, room)
                    cols[p][cell.dst] += min(u, room)
        need = [
            min(
                cap,
                sum(min(x, out_left[a]) for a, x in enumerate(row)),
                sum(min(x, in_left[d]) for d, x in enumerate(col)),
            )
            for cap, row, col in zip(self.capacity, rows, cols, strict=True)
        ]
        self._relevance[key] = bits, self.pools.pack(need)
        return self._relevance[key]

    def children(self, alts: list[_Alt], moves: list[_Move], keep: int, need: int) -> list[_Alt]:
        """Every alternative extended by every move that one of its states admits (in search
        order): the states after one of the move's ways, kept to the remaining resources
        ``keep`` and pool units ``need`` (``relevance``), Pareto-minimal."""
        guard = self.pool_guard
        fill, top = (1 << self.pools.width) - 1, self.pools.width - 1
        minimal = self.minimal
        out = []
        for code, states in alts:
            for more, ways in moves:
                nxt = []
                for used, head, bits, units, pairs, roles in states:
                    for mask, delta, more_bits, more_units, more_pairs in ways:
                        if used & mask:
                            continue
                        h = (head | guard) - delta
                        if h & guard != guard:
                            continue  # a pool over capacity
                        h ^= guard
                        over = (((h | guard) - need) & guard) >> top
                        if over:  # more headroom than the remaining cells can take
                            m = over * fill
                            h = (h & ~m) | (need & m)
                        nxt.append(
                            (
                                (used | mask) & keep,
                                h,
                                bits + more_bits,
                                units + more_units,
                                pairs + more_pairs,
                                roles,
                            )
                        )
                if nxt:
                    out.append((code + more, minimal(nxt) if len(nxt) > 1 else nxt))
        return out

    def minimal(self, states: list[_State]) -> list[_State]:
        """Best witness first; a state goes when an earlier one leaves no fewer remaining
        resources (which then takes on its roles)."""
        states.sort(key=_witness_order)
        guard = self.pool_guard
        kept: list[_State] = []
        for s in states:
            for k, y in enumerate(kept):
                if not y[0] & ~s[0] and ((y[1] | guard) - s[1]) & guard == guard:
                    if s[5] & ~y[5]:
                        kept[k] = (*y[:5], y[5] | s[5])
                    break
            else:
                kept.append(s)
        return kept

    def prune(self, alts: list[_Alt]) -> list[_Alt]:
        """Rule 2 over the alternatives of one partial shape (in search order): a state loses
        _LIVE when a dominating profile has a state leaving no fewer remaining resources, _FIRST
        when an earlier profile has one; a state without a role goes, an alternative without a
        state too."""
        rank_guard, guard = self.rank_guard, self.pool_guard
        out = []
        earlier: list[tuple[int, int]] = []  # (used, head | guard) of earlier profiles' states
        for q, (code, states) in enumerate(alts):
            better = None
            kept = []
            for s in states:
                used, head, roles = s[0], s[1], s[5]
                if roles & _FIRST:
                    for y_used, y_head in earlier:
                        if not y_used & ~used and (y_head - head) & guard == guard:
                            roles ^= _FIRST
                            break
                if roles & _LIVE:
                    if better is None:
                        better = [
                            (y[0], y[1] | guard)
                            for other, ys in alts[q + 1 :]
                            if ((other | rank_guard) - code) & rank_guard == rank_guard
                            for y in ys
                        ]
                    for y_used, y_head in better:
                        if not y_used & ~used and (y_head - head) & guard == guard:
                            roles ^= _LIVE
                            break
                if roles:
                    kept.append(s if roles == s[5] else (*s[:5], roles))
            earlier += [(s[0], s[1] | guard) for s in states]
            if kept:
                out.append((code, kept))
        return out

    def undominated(self, found: list[tuple[int, tuple]]) -> list[tuple[int, tuple]]:
        """The (profile, witness) pairs of one shape, in search order, that no later profile
        dominates (a dominating profile is higher, so later)."""
        guard = self.rank_guard
        return [
            (code, witness)
            for q, (code, witness) in enumerate(found)
            if not any(((other | guard) - code) & guard == guard for other, _ in found[q + 1 :])
        ]

    # ----- the DFS -----------------------------------------------------------------------------
    def run(self) -> CompactTree:
        start = time.perf_counter()
        records: list[_Record] = []
        fits = all(
            self.out_left[x] <= self.suf_out[0][x] and self.in_left[x] <= self.suf_in[0][x]
            for x in range(self.n_groups)
        )
        if fits and self.cells:
            _, head = self.relevance(0)
            root: list[_Alt] = [(0, [(0, head, 0, 0, (), _LIVE | _FIRST)])]
            limit = sys.getrecursionlimit()
            sys.setrecursionlimit(max(limit, 4 * len(self.cells) + 1000))
            try:
                self.explore(0, root, 0, records)
            finally:
                sys.setrecursionlimit(limit)
        records.sort(key=lambda r: r[1])
        n = self.n_groups
        shapes = np.zeros((len(records), n * n), dtype=np.int16)
        if records:
            where = [cell.src * n + cell.dst for cell in self.cells]
            shapes[:, where] = np.array([lanes for lanes, _, _ in records], dtype=np.int16)
        return CompactTree(
            shapes.reshape(len(records), n, n),
            [witness for _, _, found in records for _, witness in found],
            np.repeat(np.arange(len(records), dtype=np.int32), [len(r[2]) for r in records]),
            [code for _, _, found in records for code, _ in found],
            self.cells,
            self.fields,
            self.visited,
            self.reused,
            time.perf_counter() - start,
        )

    def explore(self, c: int, alts: list[_Alt], base: int, sink: list[_Record]) -> None:
        """Expand the partial shape whose cells before ``c`` are decided; its shapes go to
        ``sink`` with the lanes of the cells from ``base`` (the first cell of the subtree being
        searched)."""
        if c in self.memo_at and c != base:
            self.replay(c, alts, base, sink)
            return
        self.visited += 1
        if c == self.tail_from:
            self.finish(c, alts, base, sink)
            return
        cell = self.cells[c]
        a, d = cell.src, cell.dst
        out_left, in_left = self.out_left, self.in_left
        lo = max(0, out_left[a] - self.suf_out[c + 1][a], in_left[d] - self.suf_in[c + 1][d])
        hi = min(out_left[a], in_left[d], cell.most)
        weight = self.out_weight[a] + self.in_weight[d]
        for t in range(lo, hi + 1):
            out_left[a] -= t
            in_left[d] -= t
            self.degrees -= t * weight
            children = self.children(alts, self.moves(c, t), *self.relevance(c + 1))
            if len(children) > 1 and self.pruning:
                children = self.prune(children)
            if children:
                self.taken[c] = t
                self.explore(c + 1, children, base, sink)
            self.degrees += t * weight
            in_left[d] += t
            out_left[a] += t

    def finish(self, c: int, alts: list[_Alt], base: int, sink: list[_Record]) -> None:
        """Rule 4: the forced tail from cell c in one step, then COMPLETE."""
        key = (c, self.degrees)
        if key not in self._tails:
            self._tails[key] = self.tail_move(c)
        if self._tails[key] is None:
            return
        counts, move = self._tails[key]
        keep, need = (0, 0) if self.pruning else self.everything
        done = self.children(alts, [move], keep, need)
        if not done:
            return
        self.taken[c:] = counts
        found = [(code, states[0][4]) for code, states in done]
        if self.pruning and len(found) > 1:
            found = self.undominated(found)
        sink.append((tuple(self.taken[base:]), done[0][0], found))
        if not self.replaying:
            self.count(len(found))

    def tail_move(self, c: int) -> tuple[list[int], _Move] | None:
        """The forced tail from cell c under the degrees left: its lanes per cell, its packed
        profile fields and the combinations of its cells' ways; None if it cannot be had."""
        out_left, in_left = self.out_left.copy(), self.in_left.copy()
        counts, code, ways = [], 0, [(0, 0, 0, 0, ())]
        for k in range(c, len(self.cells)):
            cell = self.cells[k]
            a, d = cell.src, cell.dst
            t = max(0, out_left[a] - self.suf_out[k + 1][a], in_left[d] - self.suf_in[k + 1][d])
            if t > min(out_left[a], in_left[d], cell.most) or not self.moves(k, t):
                return None
            ((more, cell_ways),) = self.moves(k, t)  # one rate class: one split
            out_left[a] -= t
            in_left[d] -= t
            counts.append(t)
            code += more
            combined = []
            for mask, delta, bits, units, pairs in ways:
                for mask2, delta2, bits2, units2, pairs2 in cell_ways:
                    total = [
                        self.pools.field(delta, p) + self.pools.field(delta2, p)
                        for p in range(len(self.capacity))
                    ]
                    if not mask & mask2 and all(
                        u <= cap for u, cap in zip(total, self.capacity, strict=True)
                    ):
                        combined.append(
                            (
                                mask | mask2,
                                delta + delta2,
                                bits + bits2,
                                units + units2,
                                pairs + pairs2,
                            )
                        )
            if not combined:
                return None
            ways = combined
        return counts, (code, ways)

    def count(self, profiles: int) -> None:
        """Profiles found at the top of the search: the limit and the progress reports."""
        before = self.found
        self.found += profiles
        if self.found > self.max_profiles:
            raise CatalogError(
                f"more than {self.max_profiles} rate profiles (max_families)"
                + ("" if self.free is not None else ": use the factored catalog (kind='factored')")
            )
        if self.progress is not None and self.found // _REPORT > before // _REPORT:
            self.progress(self.found)

    def replay(self, c: int, alts: list[_Alt], base: int, sink: list[_Record]) -> None:
        """Rule 3: every alternative's subtree from cell c, searched once per key (cell, degrees
        left, its states with their witness order kept but their own pairs forgotten), replayed
        here, and the alternatives' shapes merged: their first profile is the first alternative's
        (alternatives come in search order) and dominated profiles go."""
        merged: dict[tuple[int, ...], list] = {}  # lanes: [first, found, from several]
        for code, states in alts:
            bits0, units0 = states[0][2], states[0][3]
            order = sorted(range(len(states)), key=lambda j: states[j][4])
            rank = [0] * len(states)
            for pos, j in enumerate(order):
                rank[j] = pos
            key = (
                c,
                self.degrees,
                tuple(
                    (s[0], s[1], s[2] - bits0, s[3] - units0, rank[j], s[5])
                    for j, s in enumerate(states)
                ),
            )
            found = self.memo.get(key)
            if found is None:
                relabelled = [
                    (s[0], s[1], s[2] - bits0, s[3] - units0, (rank[j],), s[5])
                    for j, s in enumerate(states)
                ]
                found = []
                self.replaying += 1
                try:
                    self.explore(c, [(0, relabelled)], c, found)
                finally:
                    self.replaying -= 1
                self.memo[key] = found
            else:
                self.reused += 1
            origins = [states[j][4] for j in order]
            for lanes, first, profiles in found:
                full = [(code + more, origins[pairs[0]] + pairs[1:]) for more, pairs in profiles]
                entry = merged.get(lanes)
                if entry is None:
                    merged[lanes] = [code + first, full, False]
                else:
                    entry[1] += full
                    entry[2] = True
        prefix = tuple(self.taken[base:c])
        total = 0
        for lanes, (first, found, several) in merged.items():
            if several:
                found = self.undominated(found)
            sink.append((prefix + lanes, first, found))
            total += len(found)
        if not self.replaying:
            self.count(total)


def _witness_order(s: _State) -> tuple[int, int, tuple]:
    """Fewest exclusive resources, then fewest pool units, then first in instance order."""
    return s[2], s[3], s[4]


def _splits(limits: list[int], total: int) -> Iterator[tuple[int, ...]]:
    """Vectors n with 0 <= n_i <= limits_i summing to ``total``, in lexicographic order."""
    if not limits:
        if total == 0:
            yield ()
        return
    for first in range(min(limits[0], total) + 1):
        for rest in _splits(limits[1:], total - first):
            yield (first, *rest)
