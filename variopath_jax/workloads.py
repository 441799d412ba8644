"""Demand generators: seeded N×N integer byte matrices with a zero diagonal.

- ``uniform``: the same bytes for every ordered pair (AlltoAll);
- ``moe``: random top-k expert routing (the paper's "random-demand AlltoAllv", §6);
- ``zipf``: FAST's skew AlltoAllv (Zipfian pairwise volumes, skewness s);
- ``sp``: Ulysses/USP sequence-parallel head×context layouts;
- ``load_demand``: a matrix from ``.npy`` or CSV.

Self traffic (the diagonal) is local and never scheduled, as in the paper (§2.3); loading a
matrix with a non-zero diagonal is an error unless ``drop_self=True`` zeroes it.
"""

from __future__ import annotations

from collections.abc import Callable
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
    if experts < ranks:
        raise DemandError(f"moe: {experts} experts cannot be spread over {ranks} ranks")
    if not 1 <= top_k <= experts:
        raise DemandError(f"moe: top_k must be in [1, {experts}], got {top_k}")
    if tokens < 0:
        raise DemandError(f"moe: tokens must be >= 0, got {tokens}")
    rng = np.random.default_rng(seed)
    home = (np.arange(experts) * ranks) // experts
    token_bytes = hidden * dtype_bytes
    counts = np.zeros((ranks, ranks), dtype=np.int64)
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
        counts[src] = hit.sum(axis=0)
    np.fill_diagonal(counts, 0)
    return counts * token_bytes


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
