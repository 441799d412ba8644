"""Routing traces that move: per-step MoE routing counts, generated or loaded, and the demands
they give.

A trace holds, for every training step, how many (token, expert) assignments each rank routes
to each expert: ``counts[step, rank, expert]``. :func:`moving_trace` generates one whose expert
popularity drifts and bursts from step to step (seeded): each expert's log-popularity follows a
stationary AR(1) process (an Ornstein-Uhlenbeck walk sampled per step) of standard deviation
``skew`` and per-step persistence ``1 - drift``, and with probability ``burst_rate`` per step an
expert bursts (its log-popularity jumps by ``burst_size``, decaying by ``burst_decay`` per step).
Router load in trained MoE models is skewed and shifts across steps and batches (e.g. the
expert-load analyses of Lepikhin et al. 2020, arXiv:2006.16668, and of DeepSeek-V3, arXiv:
2412.19437, §2.1.2); this generator models that qualitatively and fits nothing to either. Each
rank's ``tokens · top_k`` assignments are drawn as a multinomial over the step's popularity: the
k picks of one token are drawn independently (with replacement), a simplification of a router's
k distinct experts that keeps 256 ranks × 4,096 tokens per step cheap to sample.

:func:`load_trace` reads a trace file (``.npy``/``.npz`` of shape (steps, ranks, experts), or a
CSV of ``step,rank,expert,count`` rows); :meth:`RoutingTrace.save` writes one.
:meth:`RoutingTrace.demand` is the dispatch's byte demand at a step with experts spread evenly
over the ranks (expert e on rank ⌊e·N/E⌋, as :func:`variopath_jax.workloads.moe`), one row per
(token, expert) assignment as ``moe_dispatch`` sends them (no per-rank or per-node
deduplication); the combine's demand is its transpose. :func:`packed_lengths` gives per-rank
sequence lengths from greedy variable-length packing, for Ulysses attention.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from variopath_jax.errors import VarioPathError


class TraceError(VarioPathError):
    """A routing trace is unusable; the message names what is wrong."""


@dataclass(frozen=True)
class RoutingTrace:
    """``counts`` int64 (steps, ranks, experts): assignments routed per step, source rank and
    expert; ``top_k`` the experts per token, when known."""

    counts: np.ndarray
    top_k: int | None = None

    def __post_init__(self) -> None:
        c = np.asarray(self.counts)
        if c.ndim != 3 or 0 in c.shape:
            raise TraceError(f"a trace is (steps, ranks, experts) counts, got shape {c.shape}")
        if c.dtype.kind not in "iu" or (c < 0).any():
            raise TraceError("a trace's counts must be non-negative integers")
        object.__setattr__(self, "counts", c.astype(np.int64))

    @property
    def steps(self) -> int:
        return self.counts.shape[0]

    @property
    def ranks(self) -> int:
        return self.counts.shape[1]

    @property
    def experts(self) -> int:
        return self.counts.shape[2]

    def popularity(self) -> np.ndarray:
        """(steps, experts): each expert's share of the step's assignments."""
        per = self.counts.sum(axis=1).astype(np.float64)
        return per / np.maximum(per.sum(axis=1, keepdims=True), 1)

    def drift(self) -> np.ndarray:
        """(steps,): total-variation distance between each step's popularity and the previous
        step's (0 at step 0)."""
        p = self.popularity()
        out = np.zeros(self.steps)
        out[1:] = 0.5 * np.abs(np.diff(p, axis=0)).sum(axis=1)
        return out

    def rank_counts(self, step: int, ranks: int | None = None) -> np.ndarray:
        """(N, N) assignments from each rank to each rank's experts at ``step`` (experts spread
        evenly over N = ``ranks``, default the trace's ranks, which must then be equal)."""
        n = self.ranks if ranks is None else int(ranks)
        if n != self.ranks:
            raise TraceError(f"the trace has {self.ranks} source ranks, not {n}")
        if self.experts < n:
            raise TraceError(f"{self.experts} experts cannot be spread over {n} ranks")
        home = (np.arange(self.experts) * n) // self.experts
        out = np.zeros((n, n), np.int64)
        np.add.at(out.T, home, self.counts[step].T)
        return out

    def demand(self, step: int, token_bytes: int) -> np.ndarray:
        """The dispatch's byte demand at ``step`` (self traffic excluded)."""
        d = self.rank_counts(step) * int(token_bytes)
        np.fill_diagonal(d, 0)
        return d

    def save(self, path: str | Path) -> Path:
        """Write the trace as ``.npz`` (counts, top_k)."""
        path = Path(path)
        np.savez(path, counts=self.counts, top_k=-1 if self.top_k is None else self.top_k)
        return path if path.suffix == ".npz" else path.with_name(path.name + ".npz")


def moving_trace(
    steps: int,
    ranks: int,
    tokens: int,
    *,
    experts: int,
    top_k: int,
    skew: float = 1.0,
    drift: float = 0.05,
    burst_rate: float = 0.01,
    burst_size: float = 2.0,
    burst_decay: float = 0.7,
    seed: int = 0,
) -> RoutingTrace:
    """A seeded trace of ``steps`` steps: ``tokens`` per rank, each routed to ``top_k`` experts
    of ``experts``, popularity drifting and bursting (module docstring)."""
    if steps < 1 or ranks < 1 or tokens < 0 or experts < 1 or not 1 <= top_k <= experts:
        raise TraceError(
            f"moving_trace: needs steps, ranks, experts >= 1, tokens >= 0 and 1 <= top_k <= "
            f"experts, got {steps}, {ranks}, {experts}, {tokens}, {top_k}"
        )
    if not 0 < drift <= 1 or skew < 0 or not 0 <= burst_rate <= 1 or not 0 <= burst_decay < 1:
        raise TraceError(
            "moving_trace: drift in (0, 1], skew >= 0, burst_rate in [0, 1], burst_decay in [0, 1)"
        )
    rng = np.random.default_rng(seed)
    keep = 1.0 - drift
    z = rng.standard_normal(experts) * skew
    burst = np.zeros(experts)
    counts = np.zeros((steps, ranks, experts), np.int64)
    for s in range(steps):
        if s:
            z = keep * z + np.sqrt(1 - keep**2) * skew * rng.standard_normal(experts)
            burst *= burst_decay
        burst += burst_size * (rng.random(experts) < burst_rate)
        logits = z + burst
        p = np.exp(logits - logits.max())
        counts[s] = rng.multinomial(tokens * top_k, p / p.sum(), size=ranks)
    return RoutingTrace(counts, top_k)


def load_trace(path: str | Path, top_k: int | None = None) -> RoutingTrace:
    """A trace from ``.npy`` / ``.npz`` (array ``counts``, optional ``top_k``) or a CSV file of
    ``step,rank,expert,count`` rows (a header line and ``#`` comments are skipped)."""
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"{path}: no such file")
    if path.suffix in (".npy", ".npz"):
        try:
            data = np.load(path, allow_pickle=False)
        except ValueError as err:
            raise TraceError(f"{path}: not a readable NumPy file: {err}") from None
        if path.suffix == ".npz":
            if "counts" not in data:
                raise TraceError(f"{path}: has no 'counts' array")
            if top_k is None and "top_k" in data and int(data["top_k"]) > 0:
                top_k = int(data["top_k"])
            data = data["counts"]
        try:
            return RoutingTrace(np.asarray(data), top_k)
        except TraceError as err:
            raise TraceError(f"{path}: {err}") from None
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        fields = line.replace(",", " ").split()
        if not fields or line.lstrip().startswith("#"):
            continue
        try:
            rows.append([int(v) for v in fields])
        except ValueError:
            if not rows and n == 1:
                continue  # a header
            raise TraceError(f"{path}:{n}: expected step,rank,expert,count integers") from None
        if len(rows[-1]) != 4 or min(rows[-1]) < 0:
            raise TraceError(f"{path}:{n}: expected four non-negative integers")
    if not rows:
        raise TraceError(f"{path}: no rows")
    a = np.asarray(rows, np.int64)
    counts = np.zeros(tuple(a[:, :3].max(axis=0) + 1), np.int64)
    np.add.at(counts, (a[:, 0], a[:, 1], a[:, 2]), a[:, 3])
    return RoutingTrace(counts, top_k)


def packed_lengths(
    steps: int, ranks: int, rows: int, *, mean_doc: float = 0.3, seed: int = 0
) -> np.ndarray:
    """(steps, ranks) tokens per rank from greedy variable-length packing: documents of
    exponentially distributed length (mean ``mean_doc · rows``, at least 1) fill each rank's
    buffer of ``rows`` until the next would not fit (documents are not split)."""
    if rows < 1 or mean_doc <= 0:
        raise TraceError(f"packed_lengths: rows >= 1 and mean_doc > 0, got {rows}, {mean_doc}")
    rng = np.random.default_rng(seed)
    out = np.zeros((steps, ranks), np.int64)
    for s in range(steps):
        for r in range(ranks):
            used = 0
            while True:
                doc = max(1, int(rng.exponential(mean_doc * rows)))
                if used + doc > rows:
                    break
                used += doc
            out[s, r] = used
    return out
