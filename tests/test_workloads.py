"""Demand generators: shapes, determinism, semantics, and bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest

from variopath_jax import workloads
from variopath_jax.workloads import DemandError, validate_demand


def test_uniform() -> None:
    d = workloads.uniform(4, 100)
    assert d.dtype == np.int64 and d.sum() == 12 * 100 and not np.diagonal(d).any()


@pytest.mark.parametrize("n", [4, 16, 32])
def test_moe_semantics(n: int) -> None:
    d = workloads.moe(n, 64, seed=3)
    token = 7168 * 2
    assert d.shape == (n, n) and not np.diagonal(d).any()
    assert (d % token == 0).all()
    # a token goes at most once to each rank and to at most top_k ranks
    assert (d <= 64 * token).all()
    assert (d.sum(axis=1) <= 64 * 8 * token).all()
    assert np.array_equal(d, workloads.moe(n, 64, seed=3))
    assert not np.array_equal(d, workloads.moe(n, 64, seed=4))
    assert not workloads.moe(n, 0).any()


def test_moe_expected_fanout() -> None:
    # 256 experts over 16 ranks, top-8: a token reaches 16·(1 - C(240,8)/C(256,8)) ranks, 15/16 of them remote
    d = workloads.moe(16, 2000, seed=0)
    per_token = d.sum() / (16 * 2000 * 7168 * 2)
    expected = 16 * (1 - math.comb(240, 8) / math.comb(256, 8)) * 15 / 16
    assert per_token == pytest.approx(expected, rel=0.02)


def test_zipf() -> None:
    d = workloads.zipf(16, 0.8, 1 << 20, seed=1)
    off = d[~np.eye(16, dtype=bool)]
    assert d.sum() == 16 << 20 and (off >= 1).all() and not np.diagonal(d).any()
    assert np.array_equal(d, workloads.zipf(16, 0.8, 1 << 20, seed=1))
    # stronger skew concentrates more bytes in the largest pairs
    top = lambda m: np.sort(m[~np.eye(16, dtype=bool)])[-24:].sum() / m.sum()  # noqa: E731
    assert (
        top(workloads.zipf(16, 0.8, 1 << 20))
        > top(workloads.zipf(16, 0.4, 1 << 20))
        > top(workloads.uniform(16, 5))
    )
    with pytest.raises(DemandError, match="one byte"):
        workloads.zipf(16, 0.6, 1)


def test_sp_layout() -> None:
    d = workloads.sp(4, 2, seq_len=800, num_heads=8, head_dim=16)
    pair = (800 // 8) * (8 // 4) * 16 * 2
    assert d[0, 1] == pair and d[0, 4] == 0 and d[5, 7] == pair and not np.diagonal(d).any()
    with pytest.raises(DemandError, match="do not split"):
        workloads.sp(3, 1, num_heads=40)


def test_load_demand(tmp_path) -> None:
    d = workloads.uniform(3, 7)
    np.save(tmp_path / "d.npy", d)
    assert np.array_equal(workloads.load_demand(tmp_path / "d.npy"), d)
    (tmp_path / "d.csv").write_text("# bytes\n0,7,7\n7 0 7\n7,7,0\n")
    assert np.array_equal(workloads.load_demand(tmp_path / "d.csv", ranks=3), d)
    (tmp_path / "bad.csv").write_text("0,1\n1,0,2\n")
    with pytest.raises(DemandError, match="different lengths"):
        workloads.load_demand(tmp_path / "bad.csv")


@pytest.mark.parametrize(
    "matrix, kwargs, message",
    [
        ([[0, -1], [1, 0]], {}, r"\[0\]\[1\] = -1 is negative"),
        ([[0, 1, 2], [1, 0, 2]], {}, "square"),
        ([[0, 1], [1, 0]], {"ranks": 4}, "topology has 4 ranks"),
        ([[0, 1.5], [1, 0]], {}, "not a whole number of bytes"),
        ([[3, 1], [1, 0]], {}, "self traffic"),
        ([["a", "b"], ["c", "d"]], {}, "must be integers"),
    ],
)
def test_bad_demands(matrix, kwargs, message: str) -> None:
    with pytest.raises(DemandError, match=message):
        validate_demand(matrix, **kwargs)


def test_drop_self() -> None:
    assert not np.diagonal(validate_demand([[3, 1], [1, 0]], drop_self=True)).any()
