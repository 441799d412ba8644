"""What the LP-based plans share: the columns (a pair's bytes on one of its candidate routes),
their link incidence, and rounding an LP split to whole bytes (used by ``paced`` in
:mod:`variopath_jax.planner.model_aware` and the hybrid plans of
:mod:`variopath_jax.planner.hybrid`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse

from variopath_jax.errors import TopologyError
from variopath_jax.topology import PathModel
from variopath_jax.topology.paths import Route

PACED_ROUTES = 4  # the most candidate routes a pair's bytes are split over in the LP plans
PACED_MIN_BYTES = 4096  # a split piece smaller than this joins the pair's largest piece


@dataclass(frozen=True)
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
