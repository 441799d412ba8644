"""MoE dispatch/combine on a (2, 4) mesh ('dp', 'ep') of forced CPU host devices, exchanging over
'ep': an MoE layer (top-2 router, dispatch, grouped FFN with ragged_dot, combine) against a dense
reference forward and backward; dispatch and combine against a NumPy oracle, with and without
capacity mode; gradients of dropped rows; bad inputs."""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from variopath_jax.errors import VarioPathError
from variopath_jax.jax_ops import configure, moe_combine, moe_dispatch

DP, EP, E = 2, 4, 2  # mesh shape; local experts per 'ep' rank
pytestmark = pytest.mark.skipif(jax.device_count() < DP * EP, reason="needs 8 host devices")
SPEC = P("dp", "ep")


@pytest.fixture(scope="module")
def cfg():
    config = configure(devices=EP, timeout_s=30.0)  # the exchange axis has 4 ranks
    yield config
    configure(devices=DP * EP)  # back to the default for the other tests


EXPLICIT = jax.sharding.AxisType.Explicit


@pytest.fixture(scope="module")
def mesh():
    return jax.make_mesh((DP, EP), ("dp", "ep"), axis_types=(EXPLICIT, EXPLICIT))


@dataclass(frozen=True)
class Grid:
    """A mesh for the gradient tests: data (dp, EP, ...) laid out by ``spec``, tokens by ``tok``."""

    mesh: jax.sharding.Mesh
    dp: int
    spec: P
    tok: P


@pytest.fixture(scope="module", params=["dp2xep4", "ep4"])
def grid(request, mesh) -> Grid:
    """The (2, 4) MoE training layout, and a 1-D 'ep' mesh of 4 devices."""
    if request.param == "dp2xep4":
        return Grid(mesh, DP, SPEC, P(("dp", "ep")))
    ep = jax.make_mesh((EP,), ("ep",), axis_types=(EXPLICIT,), devices=jax.devices()[:EP])
    return Grid(ep, 1, P(None, "ep"), P("ep"))


def put(mesh, a, spec=SPEC):
    return jax.device_put(a, NamedSharding(mesh, spec))


# ----- NumPy oracle ---------------------------------------------------------------------------
def oracle(x: np.ndarray, counts: np.ndarray, cap: int, drop: bool) -> dict[str, np.ndarray]:
    """One 'ep' group. x: (EP, R, ...) rows per rank; counts[i, j, e]: rows from i to expert e of
    j. Capacity rule: receiver j keeps sources in rank order, within a source experts in order,
    within a segment rows in order, until ``cap`` rows."""
    rows = x.shape[1]
    start = np.zeros((EP, EP, E), dtype=int)  # where segment (j, e) starts in x[i]
    for i in range(EP):
        start[i] = (np.cumsum(counts[i].reshape(-1)) - counts[i].reshape(-1)).reshape(EP, E)
    got = np.zeros((EP, EP, E), dtype=int)  # got[j, s, e]
    kept = np.zeros((EP, rows), dtype=bool)
    for j in range(EP):
        room = cap if drop else np.inf
        for s in range(EP):
            for e in range(E):
                take = int(min(counts[s, j, e], room))
                room -= take
                got[j, s, e] = take
                kept[s, start[s, j, e] : start[s, j, e] + take] = True
    grouped = np.zeros((EP, cap, *x.shape[2:]), dtype=x.dtype)
    for j in range(EP):
        parts = [
            x[s, start[s, j, e] : start[s, j, e] + got[j, s, e]]
            for e in range(E)
            for s in range(EP)
        ]
        block = np.concatenate(parts)
        grouped[j, : len(block)] = block
    mask = kept.reshape(kept.shape + (1,) * (x.ndim - 2))
    return {
        "rows": grouped,
        "group_sizes": got.sum(axis=1),
        "recv_counts": got,
        "dropped": counts.transpose(1, 0, 2).sum(axis=2) - got.sum(axis=2),
        "kept": kept,
        "combined": np.where(mask, x, 0),
    }


def random_counts(rng: np.random.Generator, rows: int, high: int, dp: int = DP) -> np.ndarray:
    """(dp, EP, EP, E) counts, each rank's total at most ``rows``."""
    while True:
        counts = rng.integers(0, high, size=(dp, EP, EP, E))
        if counts.sum(axis=(2, 3)).max() <= rows:
            return counts


def run_dispatch(mesh, cfg, x, counts, cap: int, drop: bool) -> dict[str, np.ndarray]:
    """dispatch, and combine of the dispatched rows, per device of the mesh."""

    def body(xb, cb):
        d = moe_dispatch(
            xb[0, 0], cb[0, 0], axis_name="ep", out_capacity=cap, drop_overflow=drop, config=cfg
        )
        outs = (d.rows, d.group_sizes, d.recv_counts, d.dropped, d.kept, moe_combine(d.rows, d))
        return tuple(a[None, None] for a in outs)

    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(SPEC, SPEC), out_specs=(SPEC,) * 6))
    outs = f(put(mesh, x), put(mesh, counts.astype(np.int32)))
    names = ("rows", "group_sizes", "recv_counts", "dropped", "kept", "combined")
    return {k: np.asarray(v) for k, v in zip(names, outs, strict=True)}


@pytest.mark.parametrize("drop", [False, True], ids=["exact", "capacity"])
def test_dispatch_and_combine_match_numpy(mesh, cfg, drop: bool) -> None:
    rng = np.random.default_rng(11 + drop)
    rows = 20
    counts = random_counts(rng, rows, 4)
    counts[1, 2] = 0  # a rank that sends nothing
    counts[0, :, 3] = 0  # a rank that receives nothing
    x = rng.standard_normal((DP, EP, rows, 2, 3)).astype(np.float32)
    cap = 9 if drop else EP * rows  # capacity mode: well below what some ranks receive
    got = run_dispatch(mesh, cfg, x, counts, cap, drop)
    for g in range(DP):
        want = oracle(x[g], counts[g], cap, drop)
        for name, value in want.items():
            np.testing.assert_array_equal(got[name][g], value, err_msg=f"{name}, dp={g}")
    if drop:
        assert got["dropped"].sum() > 0 and got["kept"].sum() < counts.sum()
    else:
        assert not got["dropped"].any() and got["kept"].sum() == counts.sum()


def test_group_sizes_are_ragged_dot_groups(mesh, cfg) -> None:
    """Received rows times their local expert's matrix, by ragged_dot on the dispatched rows."""
    rng = np.random.default_rng(12)
    rows, cap = 16, 40
    counts = random_counts(rng, rows, 3)
    x = rng.standard_normal((DP, EP, rows, 3)).astype(np.float32)
    w = rng.standard_normal((EP * E, 3, 2)).astype(np.float32)

    def body(xb, cb, wb):
        d = moe_dispatch(xb[0, 0], cb[0, 0], axis_name="ep", out_capacity=cap, config=cfg)
        return moe_combine(jax.lax.ragged_dot(d.rows, wb, d.group_sizes), d)[None, None]

    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(SPEC, SPEC, P("ep")), out_specs=SPEC))
    got = np.asarray(f(put(mesh, x), put(mesh, counts.astype(np.int32)), put(mesh, w, P("ep"))))
    want = np.zeros((DP, EP, rows, 2), dtype=np.float32)
    for g in range(DP):
        for i in range(EP):
            expert = np.repeat(np.arange(EP * E), counts[g, i].reshape(-1))
            want[g, i, : len(expert)] = np.einsum("rd,rdh->rh", x[g, i, : len(expert)], w[expert])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_capacity_mode_dropped_rows_have_zero_gradient(grid: Grid, cfg) -> None:
    rng = np.random.default_rng(13)
    rows, cap = 20, 7
    counts = random_counts(rng, rows, 4, grid.dp)
    x = rng.standard_normal((grid.dp, EP, rows, 3)).astype(np.float32)
    v = rng.standard_normal((grid.dp, EP, rows, 3)).astype(np.float32)

    def loss(xf, cf, vf):
        def body(xb, cb, vb):
            d = moe_dispatch(
                xb[0, 0], cb[0, 0], axis_name="ep", out_capacity=cap, drop_overflow=True, config=cfg
            )
            return jnp.sum(moe_combine(d.rows**2, d) * vb[0, 0])[None, None]

        return jax.shard_map(body, mesh=grid.mesh, in_specs=(grid.spec,) * 3, out_specs=grid.spec)(
            xf, cf, vf
        ).sum()

    args = (put(grid.mesh, a, grid.spec) for a in (x, counts.astype(np.int32), v))
    g = np.asarray(jax.jit(jax.grad(loss))(*args))
    kept = np.stack([oracle(x[d], counts[d], cap, True)["kept"] for d in range(grid.dp)])
    assert (~kept & (np.arange(rows) < counts.sum(axis=(2, 3))[..., None])).any()  # some dropped
    np.testing.assert_allclose(g, np.where(kept[..., None], 2 * x * v, 0), rtol=1e-6)


# ----- the MoE layer --------------------------------------------------------------------------
T, D, H, K = 8, 4, 6, 2  # tokens per device, model width, expert hidden width, experts per token


def route(x, wr):
    """Top-K router: each token's K experts and their softmax gates."""
    logits, ids = jax.lax.top_k(x @ wr, K)
    return ids, jax.nn.softmax(logits, axis=-1)


def moe_layer(x, wr, w1, w2, *, cap: int, cfg):
    """One device's MoE layer: x (T, D), w1 (E, D, H) and w2 (E, H, D) its local experts."""
    ids, gates = route(x, wr)
    flat = ids.reshape(-1)
    order = jnp.argsort(flat, stable=True)  # grouped by destination rank, then local expert
    counts = jnp.bincount(flat, length=EP * E).reshape(EP, E)
    d = moe_dispatch(x[order // K], counts, axis_name="ep", out_capacity=cap, config=cfg)
    h = jax.nn.gelu(jax.lax.ragged_dot(d.rows, w1, d.group_sizes))
    y = moe_combine(jax.lax.ragged_dot(h, w2, d.group_sizes), d)
    y = jnp.zeros_like(y).at[order].set(y)  # back to (token, slot) order
    return (y.reshape(T, K, D) * gates[..., None]).sum(axis=1)


def dense_layer(x, wr, w1, w2):
    """The reference: every token through its K experts, densely, on one device."""
    ids, gates = route(x, wr)
    y = jnp.einsum("meh,ehd->med", jax.nn.gelu(jnp.einsum("md,edh->meh", x, w1)), w2)
    return (jnp.take_along_axis(y, ids[..., None], axis=1) * gates[..., None]).sum(axis=1)


def test_moe_layer_matches_dense_reference(grid: Grid, cfg) -> None:
    rng = np.random.default_rng(14)
    tokens = grid.dp * EP * T
    x = rng.standard_normal((tokens, D)).astype(np.float32)
    wr = rng.standard_normal((D, EP * E)).astype(np.float32)
    w1 = (rng.standard_normal((EP * E, D, H)) / np.sqrt(D)).astype(np.float32)
    w2 = (rng.standard_normal((EP * E, H, D)) / np.sqrt(H)).astype(np.float32)
    v = rng.standard_normal((tokens, D)).astype(np.float32)
    mesh, tok = grid.mesh, grid.tok
    sharded = jax.shard_map(
        lambda *a: moe_layer(*a, cap=EP * T * K, cfg=cfg),  # worst case: nothing is dropped
        mesh=mesh,
        in_specs=(tok, P(), P("ep"), P("ep")),
        out_specs=tok,
    )
    args = (put(mesh, x, tok), put(mesh, wr, P()), put(mesh, w1, P("ep")), put(mesh, w2, P("ep")))
    out = np.asarray(jax.jit(sharded)(*args))
    want = np.asarray(dense_layer(x, wr, w1, w2))
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    vs = put(mesh, v, tok)
    grads = jax.jit(jax.grad(lambda *a: (sharded(*a) * vs).sum(), argnums=(0, 1, 2, 3)))(*args)
    want_grads = jax.grad(lambda *a: (dense_layer(*a) * v).sum(), argnums=(0, 1, 2, 3))(
        x, wr, w1, w2
    )
    for name, g, w in zip(("x", "router", "w1", "w2"), grads, want_grads, strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-4, atol=1e-5, err_msg=name)


# ----- errors ---------------------------------------------------------------------------------
def trace(mesh, cfg, fn, x, counts):
    f = jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=(SPEC, SPEC), out_specs=SPEC))
    return f(put(mesh, x), put(mesh, counts))


@pytest.mark.parametrize(
    "counts_shape, dtype, message",
    [
        ((EP,), np.int32, r"send_counts must be an integer array of shape \(4, E_local\).*\(4,\)"),
        ((EP, E), np.float32, r"send_counts must be an integer array .* got float32"),
        ((EP - 1, E), np.int32, r"send_counts must be an integer array .*\(3, 2\)"),
        ((EP, 0), np.int32, "at least one local expert"),
    ],
)
def test_bad_send_counts_are_named(mesh, cfg, counts_shape, dtype, message) -> None:
    def body(xb, cb):
        return moe_dispatch(xb[0, 0], cb[0, 0], axis_name="ep", config=cfg).rows[None, None]

    counts = np.zeros((DP, EP, *counts_shape), dtype)
    with pytest.raises(VarioPathError, match=message):
        trace(mesh, cfg, body, np.zeros((DP, EP, 4, 2), np.float32), counts)


def test_bad_rows_capacity_and_combine_input_are_named(mesh, cfg) -> None:
    counts = np.zeros((DP, EP, EP, E), np.int32)
    x = np.zeros((DP, EP, 4, 2), np.float32)
    with pytest.raises(VarioPathError, match="moe_dispatch: x needs a leading row axis"):
        trace(
            mesh,
            cfg,
            lambda xb, cb: moe_dispatch(xb[0, 0, 0, 0], cb[0, 0], axis_name="ep").rows[None, None],
            x,
            counts,
        )
    with pytest.raises(VarioPathError, match="out_capacity must be >= 0, got -1"):
        trace(
            mesh,
            cfg,
            lambda xb, cb: moe_dispatch(
                xb[0, 0], cb[0, 0], axis_name="ep", out_capacity=-1, config=cfg
            ).rows[None, None],
            x,
            counts,
        )

    def wrong_rows(xb, cb):
        d = moe_dispatch(xb[0, 0], cb[0, 0], axis_name="ep", out_capacity=6, config=cfg)
        return moe_combine(d.rows[:5], d)[None, None]

    with pytest.raises(VarioPathError, match=r"moe_combine: y must have the 6 rows .* \(5, 2\)"):
        trace(mesh, cfg, wrong_rows, x, counts)


@pytest.mark.parametrize(
    "case, message",
    [
        ("negative", r"rank 3: send_counts\[2\] = -1 is negative"),
        ("too-many", "rank 1: send_counts sum to 5 rows but x has 4"),
        ("capacity", r"rank 0 receives 8 rows but its output holds 3 \(raise out_capacity\)"),
    ],
)
@pytest.mark.parametrize("drop", [False, True], ids=["exact", "capacity"])
def test_bad_counts_at_run_time_are_errors(mesh, cfg, case: str, message: str, drop: bool) -> None:
    counts = np.zeros((DP, EP, EP, E), np.int32)
    if case == "negative":
        counts[1, 3, 2] = [3, -1]  # sums to a plausible 2: must still be refused
    elif case == "too-many":
        counts[0, 1, 0] = [3, 2]
    else:
        counts[:, :, 0, 1] = 2  # every rank sends 2 rows to rank 0's expert 1
    x = np.ones((DP, EP, 4, 2), np.float32)

    def body(xb, cb):
        d = moe_dispatch(
            xb[0, 0], cb[0, 0], axis_name="ep", out_capacity=3, drop_overflow=drop, config=cfg
        )
        return d.rows[None, None], d.dropped[None, None]

    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(SPEC, SPEC), out_specs=(SPEC, SPEC)))
    if case == "capacity" and drop:  # capacity mode keeps 3 of rank 0's 8 rows instead
        rows, dropped = (np.asarray(a) for a in f(put(mesh, x), put(mesh, counts)))
        np.testing.assert_array_equal(dropped[:, 0], [[0, 1, 2, 2]] * DP)
        np.testing.assert_array_equal(rows[:, 0], np.ones((DP, 3, 2)))
        return
    with pytest.raises(jax.errors.JaxRuntimeError, match=message):
        jax.block_until_ready(f(put(mesh, x), put(mesh, counts)))
