"""Routing traces (variopath_jax.traces): seeded, drifting and bursting, conserved token counts,
demands with experts spread evenly, files round-trip, bad inputs named."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from variopath_jax.traces import (
    RoutingTrace,
    TraceError,
    load_trace,
    moving_trace,
    packed_lengths,
)


def test_moving_trace_is_seeded_and_conserves_assignments() -> None:
    a = moving_trace(20, 4, 64, experts=16, top_k=2, seed=3)
    b = moving_trace(20, 4, 64, experts=16, top_k=2, seed=3)
    c = moving_trace(20, 4, 64, experts=16, top_k=2, seed=4)
    np.testing.assert_array_equal(a.counts, b.counts)
    assert not np.array_equal(a.counts, c.counts)
    assert a.counts.shape == (20, 4, 16)
    assert (a.counts.sum(axis=2) == 64 * 2).all()  # every rank routes tokens · k assignments


def test_popularity_drifts_more_with_more_drift_and_bursts() -> None:
    """Slow drift keeps consecutive steps close; fast drift moves them apart; bursts make an
    expert's share jump."""
    common = dict(experts=32, top_k=4, seed=1, burst_rate=0.0)
    slow = moving_trace(60, 8, 4096, drift=0.01, **common)
    fast = moving_trace(60, 8, 4096, drift=0.5, **common)
    assert fast.drift()[1:].mean() > 3 * slow.drift()[1:].mean()
    assert slow.drift()[0] == 0
    # under slow drift the distance from the first step grows over the steps
    p = slow.popularity()
    assert 0.5 * np.abs(p[-1] - p[0]).sum() > 0.5 * np.abs(p[1] - p[0]).sum()
    quiet = moving_trace(60, 8, 4096, experts=32, top_k=4, seed=1, drift=0.01, burst_rate=0.0)
    bursty = moving_trace(
        60, 8, 4096, experts=32, top_k=4, seed=1, drift=0.01, burst_rate=0.05, burst_size=3.0
    )
    jump = lambda t: np.abs(np.diff(t.popularity(), axis=0)).max()  # noqa: E731
    assert jump(bursty) > 2 * jump(quiet)


def test_demand_spreads_experts_evenly_and_combine_is_its_transpose() -> None:
    counts = np.zeros((1, 2, 4), np.int64)
    counts[0, 0] = [1, 2, 3, 4]  # experts 0, 1 on rank 0; 2, 3 on rank 1
    counts[0, 1] = [5, 0, 0, 7]
    t = RoutingTrace(counts, 2)
    np.testing.assert_array_equal(t.rank_counts(0), [[3, 7], [5, 7]])
    np.testing.assert_array_equal(t.demand(0, 10), [[0, 70], [50, 0]])
    with pytest.raises(TraceError, match="has 2 source ranks, not 3"):
        t.rank_counts(0, 3)


@pytest.mark.parametrize("suffix", [".npz", ".npy", ".csv"])
def test_trace_files_round_trip(tmp_path: Path, suffix: str) -> None:
    t = moving_trace(5, 3, 10, experts=6, top_k=2, seed=2)
    path = tmp_path / f"trace{suffix}"
    if suffix == ".npz":
        t.save(path)
    elif suffix == ".npy":
        np.save(path, t.counts)
    else:
        s, r, e = np.nonzero(t.counts)
        lines = ["step,rank,expert,count"] + [
            f"{a},{b},{c},{t.counts[a, b, c]}" for a, b, c in zip(s, r, e, strict=True)
        ]
        path.write_text("\n".join(lines) + "\n")
    got = load_trace(path)
    np.testing.assert_array_equal(got.counts[:, :, : t.experts], t.counts)
    assert got.top_k == (2 if suffix == ".npz" else None)


def test_bad_traces_are_named(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match=r"\(steps, ranks, experts\)"):
        RoutingTrace(np.zeros((3, 4), np.int64))
    with pytest.raises(TraceError, match="non-negative integers"):
        RoutingTrace(-np.ones((1, 2, 2), np.int64))
    bad = tmp_path / "bad.csv"
    bad.write_text("step,rank,expert,count\n0,0,1,x\n")
    with pytest.raises(TraceError, match=r"bad\.csv:2"):
        load_trace(bad)
    with pytest.raises(TraceError, match="no such file"):
        load_trace(tmp_path / "missing.npz")
    with pytest.raises(TraceError, match="moving_trace"):
        moving_trace(0, 2, 4, experts=4, top_k=2)


def test_packed_lengths_fill_without_splitting_documents() -> None:
    lengths = packed_lengths(50, 8, 100, seed=5)
    assert lengths.shape == (50, 8) and (lengths <= 100).all() and (lengths >= 0).all()
    assert len(np.unique(lengths)) > 10  # uneven
    np.testing.assert_array_equal(lengths, packed_lengths(50, 8, 100, seed=5))
