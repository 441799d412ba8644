"""Demand generators: seeded N×N integer byte matrices with a zero diagonal.

- ``uniform``: the same bytes for every ordered pair (AlltoAll);
- ``moe``: random top-k expert routing (the paper's "random-demand AlltoAllv", §6);
- ``moe_nodes``: the same routing as a :class:`NodeDemand`, which also carries per-node
  multiplicity (a token bound for several experts of one node counted once per node), the form
  DeepEP's normal mode deduplicates on;
- ``zipf``: FAST's skew AlltoAllv (Zipfian pairwise volumes, skewness s);
- ``sp``: Ulysses/USP sequence-parallel head×context layouts;
- ``load_demand``: a matrix from ``.npy`` or CSV.

Self traffic (the diagonal) is local and never scheduled, as in the paper (§2.3); loading a
matrix with a non-zero diagonal is an error unless ``drop_self=True`` zeroes it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from variopath_jax.errors import VarioPathError


class DemandError(VarioPathError):
    """A demand matrix is unusable; the message names what is wrong."""


def validate_demand(
    demand: object, ranks: int | None = None, source: str = "demand", drop_self: bool = False
) -> np.ndarray:
    """Check and normalise a demand matrix to int64; return it."""
    arr = np.asarray(demand)
    if arr.ndim != 2 or arr.shape[0] != arr.shape[1]:
        raise DemandError(f"{source}: must be a square N×N matrix, got shape {arr.shape}")
    if ranks is not None and arr.shape[0] != ranks:
        raise DemandError(
            f"{source}: is {arr.shape[0]}×{arr.shape[1]} but the topology has {ranks} ranks"
        )
    if arr.dtype.kind == "f":
        if not np.all(np.isfinite(arr)):
            raise DemandError(f"{source}: has non-finite entries")
        if not np.all(arr == np.round(arr)):
            bad = np.argwhere(arr != np.round(arr))[0]
            raise DemandError(
                f"{source}: entry [{bad[0]}][{bad[1]}] = {arr[tuple(bad)]} is not a whole number of bytes"
            )
    elif arr.dtype.kind not in "iu":
        raise DemandError(f"{source}: entries must be integers (bytes), got dtype {arr.dtype}")
    arr = arr.astype(np.int64)
    if (arr < 0).any():
        bad = np.argwhere(arr < 0)[0]
        raise DemandError(f"{source}: entry [{bad[0]}][{bad[1]}] = {arr[tuple(bad)]} is negative")
    diag = np.diagonal(arr)
    if diag.any():
        if not drop_self:
            k = int(np.flatnonzero(diag)[0])
            raise DemandError(
                f"{source}: D[{k}][{k}] = {diag[k]}: self traffic is a local copy and is never scheduled; "
                "zero the diagonal or drop it explicitly (drop_self / --drop-self)"
            )
        arr = arr.copy()
        np.fill_diagonal(arr, 0)
    return arr


def uniform(ranks: int, bytes_per_pair: int) -> np.ndarray:
    """AlltoAll: every rank sends ``bytes_per_pair`` to every other rank."""
    if bytes_per_pair < 0:
        raise DemandError(f"bytes_per_pair must be >= 0, got {bytes_per_pair}")
    d = np.full((ranks, ranks), int(bytes_per_pair), dtype=np.int64)
    np.fill_diagonal(d, 0)
    return d


def moe(
    ranks: int,
    tokens: int,
    *,
    experts: int = 256,
    top_k: int = 8,
    hidden: int = 7168,
    dtype_bytes: int = 2,
    seed: int = 0,
) -> np.ndarray:
    """Expert-parallel dispatch with random top-k routing (paper §6: 256 experts, top-8).

    Experts are spread evenly over ranks (expert e lives on rank ⌊e·N/E⌋); every token of every
    rank picks ``top_k`` distinct experts uniformly at random and is sent once to each other rank
    hosting any of them. A token is ``hidden × dtype_bytes`` bytes (7168 × bf16 = 14 KiB).
    """
    counts = np.zeros((ranks, ranks), dtype=np.int64)
    for src, hit in _moe_hits(ranks, tokens, experts, top_k, seed):
        counts[src] = hit.sum(axis=0)
    np.fill_diagonal(counts, 0)
    return counts * (hidden * dtype_bytes)


def _moe_hits(
    ranks: int, tokens: int, experts: int, top_k: int, seed: int
) -> Iterator[tuple[int, np.ndarray]]:
    """Per source rank (in order, none when ``tokens`` is 0): the (tokens, ranks) boolean matrix
    of which ranks each of its tokens goes to (``moe``'s routing, checked arguments)."""
    if experts < ranks:
        raise DemandError(f"moe: {experts} experts cannot be spread over {ranks} ranks")
    if not 1 <= top_k <= experts:
        raise DemandError(f"moe: top_k must be in [1, {experts}], got {top_k}")
    if tokens < 0:
        raise DemandError(f"moe: tokens must be >= 0, got {tokens}")
    rng = np.random.default_rng(seed)
    home = (np.arange(experts) * ranks) // experts
    for src in range(ranks):
        if tokens == 0:
            continue
        # top-k distinct experts per token: the k smallest of iid uniform keys
        keys = rng.random((tokens, experts))
        choice = (
            np.argpartition(keys, top_k - 1, axis=1)[:, :top_k]
            if top_k < experts
            else np.tile(np.arange(experts), (tokens, 1))
        )
        hit = np.zeros((tokens, ranks), dtype=bool)
        np.put_along_axis(hit, home[choice], True, axis=1)
        yield src, hit


@dataclass(frozen=True)
class NodeDemand:
    """An MoE dispatch demand with per-node multiplicity (issue 30).

    The rank-pair demand counts a token once per destination *rank*; DeepEP's normal mode (its
    ``docs/legacy.md``: "RDMA goes to the GPU with the same local index in the destination node,
    then NVLink forwarding"; research/peer-systems.md §5) sends a token once per destination
    *node* and fans it out inside that node. This form carries both.

    Attributes
    ----------
    pairs : int64 (N, N)
        Bytes from rank i to rank j, a token counted once per destination rank (zero diagonal):
        what ``moe`` returns for the same arguments.
    node : int64 (N, N / m)
        Bytes from rank i to node n, a token counted once per node it has a destination rank on
        (ranks other than i itself).
    gpus_per_node : int
        m: ranks r·m .. r·m + m - 1 form node r.
    tokens, token_bytes : int
        Tokens per rank and bytes per token.
    token_ranks, token_nodes : int64 (N,)
        Per source rank: token-destinations summed over its tokens, counting ranks on other nodes
        (``token_ranks``) and other nodes (``token_nodes``): what crosses the network without and
        with deduplication.
    single : int64 (N, N), optional
        The part of ``pairs`` made of tokens whose only destination on j's node is j: nothing to
        fan out, so :meth:`two_phase` may send them straight to j (``direct_single``).
    """

    pairs: np.ndarray
    node: np.ndarray
    gpus_per_node: int
    tokens: int
    token_bytes: int
    token_ranks: np.ndarray
    token_nodes: np.ndarray
    single: np.ndarray | None = None

    @property
    def ranks(self) -> int:
        return int(self.pairs.shape[0])

    @property
    def nodes(self) -> int:
        return self.ranks // self.gpus_per_node

    def node_of(self, rank: int) -> int:
        return rank // self.gpus_per_node

    def _remote(self) -> np.ndarray:
        """(N, N) mask of the rank pairs on different nodes."""
        node = np.arange(self.ranks) // self.gpus_per_node
        return node[:, None] != node[None, :]

    def inter_node_bytes(self, dedup: bool) -> int:
        """Bytes that cross the network: once per destination rank, or once per node."""
        if not dedup:
            return int(self.pairs[self._remote()].sum())
        own = np.arange(self.ranks) // self.gpus_per_node
        remote = own[:, None] != np.arange(self.nodes)[None, :]
        return int(self.node[remote].sum())

    def crossings_per_token(self) -> tuple[float, float]:
        """(ranks, nodes) on other nodes a token goes to, on average over every token."""
        total = self.ranks * self.tokens
        if total == 0:
            return 0.0, 0.0
        return float(self.token_ranks.sum() / total), float(self.token_nodes.sum() / total)

    def relay(self, src: int, node: int) -> int:
        """The GPU of ``node`` that receives ``src``'s deduplicated tokens and fans them out: the
        one with ``src``'s local index (DeepEP's rail-aligned choice)."""
        return node * self.gpus_per_node + src % self.gpus_per_node

    def two_phase(self, direct_single: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """The deduplicated dispatch as two rank-pair demands (zero diagonals).

        Phase 1: pairs on one node directly, and each token once per other node it goes to, to
        that node's relay (:meth:`relay`). Phase 2, once phase 1's bytes have arrived: each relay
        forwards to the other ranks of its node what they get from the sources it relays for.
        A destination that is the relay itself got its bytes in phase 1. With
        ``direct_single`` (needs ``single``), a token with one destination on a node goes
        straight there in phase 1 and only tokens with several go through the relay: the same
        inter-node bytes, less to forward.
        """
        if direct_single and self.single is None:
            raise DemandError("two_phase: direct_single needs the demand's single part")
        n, m = self.ranks, self.gpus_per_node
        remote = self._remote()
        first = np.where(remote, 0, self.pairs)
        second = np.zeros((n, n), dtype=np.int64)
        for i in range(n):
            for node in range(self.nodes):
                if node == self.node_of(i):
                    continue
                r = self.relay(i, node)
                block = slice(node * m, (node + 1) * m)
                alone = self.single[i, block] if direct_single else np.zeros(m, np.int64)
                first[i, block] += alone
                first[i, r] += self.node[i, node] - alone.sum()
                for j in range(node * m, (node + 1) * m):
                    if j != r:
                        second[r, j] += self.pairs[i, j] - alone[j - node * m]
        np.fill_diagonal(first, 0)
        return first, second


def moe_nodes(
    ranks: int,
    tokens: int,
    gpus_per_node: int,
    *,
    experts: int = 256,
    top_k: int = 8,
    hidden: int = 7168,
    dtype_bytes: int = 2,
    seed: int = 0,
) -> NodeDemand:
    """``moe``'s routing (the same draws for the same arguments: ``pairs`` equals ``moe``'s
    matrix) as a :class:`NodeDemand` over nodes of ``gpus_per_node`` ranks."""
    if gpus_per_node < 1 or ranks % gpus_per_node:
        raise DemandError(f"moe_nodes: {ranks} ranks do not split into nodes of {gpus_per_node}")
    nodes = ranks // gpus_per_node
    token_bytes = hidden * dtype_bytes
    pairs = np.zeros((ranks, ranks), dtype=np.int64)
    node = np.zeros((ranks, nodes), dtype=np.int64)
    token_ranks = np.zeros(ranks, dtype=np.int64)
    token_nodes = np.zeros(ranks, dtype=np.int64)
    single = np.zeros((ranks, ranks), dtype=np.int64)
    for src, hit in _moe_hits(ranks, tokens, experts, top_k, seed):
        hit[:, src] = False  # self traffic is local
        pairs[src] = hit.sum(axis=0)
        on_node = hit.reshape(len(hit), nodes, gpus_per_node).sum(axis=2)  # [token, node]
        single[src] = (hit & (np.repeat(on_node, gpus_per_node, axis=1) == 1)).sum(axis=0)
        per_node = on_node > 0
        node[src] = per_node.sum(axis=0)
        own = src // gpus_per_node
        token_ranks[src] = int(
            pairs[src].sum() - pairs[src, own * gpus_per_node : (own + 1) * gpus_per_node].sum()
        )
        token_nodes[src] = int(node[src].sum() - node[src, own])
    return NodeDemand(
        pairs * token_bytes,
        node * token_bytes,
        int(gpus_per_node),
        int(tokens),
        int(token_bytes),
        token_ranks,
        token_nodes,
        single * token_bytes,
    )


def zipf(ranks: int, skew: float, bytes_per_rank: int, *, seed: int = 0) -> np.ndarray:
    """FAST's skew AlltoAllv: pairwise volumes from a Zipf distribution with factor ``skew``.

    The N(N-1) off-diagonal pairs are put in a random order; the pair of rank k gets a weight
    k^-s (FAST §6: "a larger factor produces more mice flows and amplifies elephant flows";
    their traces show s between 0.4 and 0.8). Weights are scaled so the whole matrix carries
    ``ranks × bytes_per_rank`` bytes (so ``bytes_per_rank`` is the mean per-rank payload; rows and
    columns are skewed too) and rounded to integers by largest remainders, every pair at least 1.
    """
    if skew < 0:
        raise DemandError(f"zipf: skew must be >= 0, got {skew}")
    pairs = ranks * (ranks - 1)
    total = int(bytes_per_rank) * ranks
    if pairs and total < pairs:
        raise DemandError(f"zipf: {total} bytes cannot give each of the {pairs} pairs one byte")
    rng = np.random.default_rng(seed)
    weights = np.arange(1, pairs + 1, dtype=np.float64) ** (-float(skew))
    weights = weights[rng.permutation(pairs)]
    values = _apportion(weights, total)
    d = np.zeros((ranks, ranks), dtype=np.int64)
    d[~np.eye(ranks, dtype=bool)] = values
    return d


def _apportion(weights: np.ndarray, total: int) -> np.ndarray:
    """Integers proportional to ``weights``, each >= 1, summing exactly to ``total``."""
    n = len(weights)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    share = weights / weights.sum() * (total - n)
    base = np.floor(share).astype(np.int64)
    rest = (total - n) - int(base.sum())
    order = np.argsort(-(share - base), kind="stable")
    base[order[:rest]] += 1
    return base + 1


def sp(
    heads_parallel: int,
    context_parallel: int,
    *,
    seq_len: int = 75600,
    num_heads: int = 40,
    head_dim: int = 128,
    dtype_bytes: int = 2,
) -> np.ndarray:
    """One Ulysses all-to-all of unified sequence parallelism (USP/LoongTrain, H×C ranks).

    Rank r = c·H + h holds seq_len/N tokens of all heads; within its head-parallel group (the H
    ranks sharing c) it sends each peer the peer's num_heads/H heads of its tokens:
    (seq_len/N)·(num_heads/H)·head_dim·dtype_bytes bytes. Defaults: Wan2.1 (the paper's §6.2:
    sequence 75,600, 40 heads, head dim 128, bf16).
    """
    h, c = heads_parallel, context_parallel
    if h < 1 or c < 1:
        raise DemandError(f"sp: H and C must be >= 1, got H={h} C={c}")
    n = h * c
    if num_heads % h:
        raise DemandError(f"sp: {num_heads} heads do not split over H={h}")
    pair = (seq_len // n) * (num_heads // h) * head_dim * dtype_bytes
    d = np.zeros((n, n), dtype=np.int64)
    for group in range(c):
        members = np.arange(group * h, (group + 1) * h)
        d[np.ix_(members, members)] = pair
    np.fill_diagonal(d, 0)
    return d


_NPY_MAGIC = b"\x93NUMPY"


def load_demand(path: str | Path, ranks: int | None = None, drop_self: bool = False) -> np.ndarray:
    """A demand matrix from a ``.npy`` file or a CSV file (comma or whitespace separated)."""
    path = Path(path)
    if not path.is_file():
        raise DemandError(f"{path}: no such file")
    if path.suffix == ".npy":
        with path.open("rb") as fh:
            head = fh.read(len(_NPY_MAGIC))
        if head != _NPY_MAGIC:
            raise DemandError(
                f"{path}: not a NumPy .npy file (it does not start with the .npy header); save "
                "the matrix with numpy.save, or give a CSV file"
            )
        try:
            arr = np.load(path, allow_pickle=False)
        except ValueError as err:
            if "pickle" in str(err):
                raise DemandError(
                    f"{path}: holds Python objects (an object array), not a numeric matrix"
                ) from None
            raise DemandError(f"{path}: not a readable .npy array: {err}") from None
    else:
        text = path.read_text()
        rows = [
            line.replace(",", " ").split()
            for line in text.splitlines()
            if line.strip() and not line.startswith("#")
        ]
        try:
            values = [[float(v) for v in row] for row in rows]
        except ValueError as err:
            raise DemandError(f"{path}: {err}") from None
        if len({len(r) for r in values}) > 1:
            raise DemandError(
                f"{path}: rows have different lengths {sorted({len(r) for r in values})}"
            )
        arr = np.array(values)
    return validate_demand(arr, ranks, str(path), drop_self)


WORKLOADS: dict[str, Callable[..., np.ndarray]] = {
    "uniform": uniform,
    "moe": moe,
    "zipf": zipf,
    "sp": sp,
}
