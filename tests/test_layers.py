"""The layers (variopath_jax.layers) on 8 forced CPU host devices, against dense single-device
references, forward and gradients, on (8,), (2, 4) and (2, 2, 2) meshes: the MoE block (dropless
and capacity mode) exchanging over the expert axis (or two axes), Ulysses attention with uneven
per-device lengths and packed segments over the sequence axis (or two axes); and the op's
planning counted: the combine and the backward reuse the dispatch's plan, transposed."""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from variopath_jax._native import plan_counts
from variopath_jax.errors import VarioPathError
from variopath_jax.jax_ops import configure
from variopath_jax.layers import (
    MoEParams,
    attention_reference,
    init_attention,
    init_moe,
    moe_block,
    moe_reference,
    ulysses_attention,
)

pytestmark = pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 host devices")
EXPLICIT = jax.sharding.AxisType.Explicit


@dataclass(frozen=True)
class Layout:
    """A mesh: ``data`` its data axis (or None), ``model`` the exchange axis (or axes)."""

    mesh: jax.sharding.Mesh
    data: str | None
    model: str | tuple[str, ...]

    @property
    def dp(self) -> int:
        return 1 if self.data is None else self.mesh.shape[self.data]

    @property
    def n(self) -> int:
        names = self.model if isinstance(self.model, tuple) else (self.model,)
        return int(np.prod([self.mesh.shape[a] for a in names]))

    @property
    def tokens(self) -> P:
        """Rows sharded over every axis, data first."""
        names = self.model if isinstance(self.model, tuple) else (self.model,)
        return P(((self.data,) if self.data else ()) + names)

    @property
    def blocks(self) -> P:
        """(dp, n, ...) arrays: one block per device."""
        return P(self.data, self.model)


def layout(shape: tuple[int, ...]) -> Layout:
    if shape == (8,):
        return Layout(jax.make_mesh(shape, ("m",), axis_types=(EXPLICIT,)), None, "m")
    if shape == (2, 4):
        return Layout(jax.make_mesh(shape, ("d", "m"), axis_types=(EXPLICIT,) * 2), "d", "m")
    mesh = jax.make_mesh(shape, ("d", "m1", "m2"), axis_types=(EXPLICIT,) * 3)
    return Layout(mesh, "d", ("m1", "m2"))


MESHES = [(8,), (2, 4), (2, 2, 2)]
ids = ["x".join(map(str, s)) for s in MESHES]


@pytest.fixture(scope="module", params=MESHES, ids=ids)
def lay(request) -> Layout:
    return layout(request.param)


def put(mesh, a, spec):
    return jax.device_put(a, NamedSharding(mesh, spec))


def assert_close(got, want, what: str, rtol: float = 1e-4) -> None:
    """f32 equal up to summation order: relative to the largest entry."""
    got, want = np.asarray(got), np.asarray(want)
    scale = max(float(np.abs(want).max()), 1e-6)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * scale, err_msg=what)


# ----- MoE ------------------------------------------------------------------------------------
T, D, F, LOCAL, K = 6, 8, 12, 2, 2  # tokens per device, width, FFN width, local experts, top-k


def moe_case(lay: Layout, capacity: int | None, seed: int):
    cfg = configure(devices=lay.n, timeout_s=30.0)
    experts = lay.n * LOCAL
    params = init_moe(seed, D, F, experts)
    rng = np.random.default_rng(seed)
    m = lay.dp * lay.n * T
    x = rng.standard_normal((m, D)).astype(np.float32)
    v = rng.standard_normal((m, D)).astype(np.float32)
    expert_spec = P(lay.model)
    pspec = type(params)(P(), expert_spec, expert_spec)

    def body(xb, pb):
        y, st = moe_block(
            xb,
            pb,
            axis_name=lay.model,
            top_k=K,
            capacity=capacity,
            dropless=capacity is None,
            config=cfg,
        )
        return y, st.kept

    f = jax.shard_map(
        body, mesh=lay.mesh, in_specs=(lay.tokens, pspec), out_specs=(lay.tokens, lay.tokens)
    )
    xs = put(lay.mesh, x, lay.tokens)
    ps = jax.tree.map(lambda a, s: put(lay.mesh, a, s), params, pspec)
    return f, xs, ps, x, v, params


@pytest.mark.parametrize("capacity", [None, 5], ids=["dropless", "capacity5"])
def test_moe_block_matches_dense_reference(lay: Layout, capacity) -> None:
    f, xs, ps, x, v, params = moe_case(lay, capacity, seed=3)
    y, kept = jax.jit(f)(xs, ps)
    kept = np.asarray(kept)
    if capacity is None:
        assert kept.all()
    else:
        assert not kept.all()  # some slots were dropped: the reference drops the same
    assert_close(y, moe_reference(x, params, top_k=K, kept=kept), "forward")
    vs = put(lay.mesh, v, lay.tokens)

    def loss(xa, pa):
        return (f(xa, pa)[0] * vs).sum()

    def ref_loss(xa, pa):
        return (moe_reference(xa, pa, top_k=K, kept=kept) * v).sum()

    got = jax.jit(jax.grad(loss, argnums=(0, 1)))(xs, ps)
    want = jax.grad(ref_loss, argnums=(0, 1))(x, params)
    assert_close(got[0], want[0], "d x")
    for name in ("router", "w1", "w2"):
        assert_close(getattr(got[1], name), getattr(want[1], name), f"d {name}")


def test_moe_block_in_bf16_is_within_its_precision() -> None:
    """bf16 tokens and weights on the (2, 4) mesh against the f32 reference of the same (rounded)
    values: forward and gradients within a few bf16 ulps of the largest entry (bf16 keeps 8
    significant bits, 2^-8 = 0.4%)."""
    lay = layout((2, 4))
    cfg = configure(devices=4, timeout_s=30.0)
    params = init_moe(3, D, F, 4 * LOCAL, jnp.bfloat16)
    rng = np.random.default_rng(3)
    x = jnp.asarray(rng.standard_normal((8 * T, D)), jnp.bfloat16)
    v = jnp.asarray(rng.standard_normal((8 * T, D)), jnp.bfloat16)
    pspec = type(params)(P(), P("m"), P("m"))

    def body(xb, pb):
        return moe_block(xb, pb, axis_name="m", top_k=K, dropless=True, config=cfg)[0]

    f = jax.shard_map(body, mesh=lay.mesh, in_specs=(lay.tokens, pspec), out_specs=lay.tokens)
    xs, vs = (put(lay.mesh, a, lay.tokens) for a in (x, v))
    ps = jax.tree.map(lambda a, s: put(lay.mesh, a, s), params, pspec)
    p32 = jax.tree.map(lambda a: a.astype(jnp.float32), params)
    x32, v32 = x.astype(jnp.float32), v.astype(jnp.float32)
    y = jax.jit(f)(xs, ps)
    assert y.dtype == jnp.bfloat16
    assert_close(y.astype(jnp.float32), moe_reference(x32, p32, top_k=K), "forward", 2e-2)

    def loss(xa, pa):
        return (f(xa, pa).astype(jnp.float32) * vs.astype(jnp.float32)).sum()

    got = jax.jit(jax.grad(loss, argnums=(0, 1)))(xs, ps)
    want = jax.grad(lambda xa, pa: (moe_reference(xa, pa, top_k=K) * v32).sum(), argnums=(0, 1))(
        x32, p32
    )
    assert got[0].dtype == jnp.bfloat16
    assert_close(got[0].astype(jnp.float32), want[0], "d x", 2e-2)
    for name in ("router", "w1", "w2"):
        g = getattr(got[1], name).astype(jnp.float32)
        assert_close(g, getattr(want[1], name), f"d {name}", 2e-2)


def test_moe_block_refuses_a_router_of_the_wrong_size() -> None:
    lay = layout((8,))
    cfg = configure(devices=8, timeout_s=30.0)
    router = np.zeros((D, 8 * LOCAL + 1), np.float32)  # 17 experts, the axis holds 16
    w1, w2 = np.zeros((8 * LOCAL, D, F), np.float32), np.zeros((8 * LOCAL, F, D), np.float32)

    def body(xb, w1b, w2b):
        return moe_block(xb, MoEParams(router, w1b, w2b), axis_name="m", top_k=K, config=cfg)[0]

    f = jax.jit(jax.shard_map(body, mesh=lay.mesh, in_specs=(P("m"),) * 3, out_specs=P("m")))
    args = (put(lay.mesh, a, P("m")) for a in (np.zeros((8 * T, D), np.float32), w1, w2))
    with pytest.raises(VarioPathError, match="scores 17 experts but the expert axis has 8"):
        f(*args)


# ----- the backward pass plans nothing new ----------------------------------------------------
def test_combine_and_backward_reuse_the_dispatch_plan_transposed() -> None:
    """One MoE block's step, forward and backward, on a (2, 4) mesh: each of the two expert
    groups plans its dispatch demand once; the combine (the dispatch's demand transposed) and the
    two backward exchanges (their transposes), first calls of their sites like it (one decision,
    the safe one), are served from that plan. A fresh configuration starts with an empty plan
    cache."""
    lay = layout((2, 4))
    f, xs, ps, x, v, params = moe_case(lay, None, seed=5)  # configures anew
    vs = put(lay.mesh, v, lay.tokens)
    step = jax.jit(jax.value_and_grad(lambda xa, pa: (f(xa, pa)[0] * vs).sum(), argnums=(0, 1)))
    step.lower(xs, ps).compile()  # compiling plans nothing
    before = np.asarray(plan_counts())
    jax.block_until_ready(step(xs, ps))
    planned, exact, transposed = np.asarray(plan_counts()) - before
    # the dispatch demands the op planned: one per expert group, unless the two are equal
    ids = np.asarray(jax.lax.top_k(x @ np.asarray(params.router), K)[1]).reshape(2, 4, T * K)
    demands = set()
    for g in range(2):
        sent = np.zeros((4, 4), np.int64)
        for i in range(4):
            sent[i] = np.bincount(ids[g, i] // LOCAL, minlength=4)
        np.fill_diagonal(sent, 0)
        demands.add(sent.tobytes())
    assert planned == len(demands) == 2
    # per group: combine forward and dispatch backward (Dᵀ) reuse it transposed, the combine's
    # backward (D) as is
    assert transposed == 2 * 2 and exact == 2 * 1
    before = np.asarray(plan_counts())
    jax.block_until_ready(step(xs, ps))  # the same routing again: each site's decided plan
    planned, exact, transposed = np.asarray(plan_counts()) - before
    # each site now applies the decision made from its first demand; the sites of one demand
    # (D: the dispatch and the combine's backward; Dᵀ: the other two) decided alike, so each
    # group plans D and Dᵀ at most once, and every call is served
    assert planned <= 2 * 2 and planned + exact + transposed == 2 * 4


# ----- Ulysses --------------------------------------------------------------------------------
L, DA, HEADS, HD = 6, 8, 8, 4  # rows per device, width, heads, head dim


def ulysses_case(lay: Layout, seed: int, causal: bool):
    cfg = configure(devices=lay.n, timeout_s=30.0)
    params = init_attention(seed, DA, HEADS, HD)
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, L + 1, size=(lay.dp, lay.n)).astype(np.int32)
    lengths[:, 0] = L  # a full chunk, and (for some seeds) empty ones
    lengths[0, -1] = 0
    x = rng.standard_normal((lay.dp, lay.n, L, DA)).astype(np.float32)
    # packed documents: segment ids rise along the sequence (across devices)
    seg = np.cumsum(rng.random((lay.dp, lay.n * L)) < 0.2, axis=-1).astype(np.int32)
    seg = seg.reshape(lay.dp, lay.n, L)
    x = np.where(np.arange(L)[None, None, :, None] < lengths[..., None, None], x, 0)
    spec = lay.blocks

    def body(xb, nb, sb, pb):
        return ulysses_attention(
            xb[0, 0],
            nb[0, 0],
            pb,
            axis_name=lay.model,
            heads=HEADS,
            segment_ids=sb[0, 0],
            causal=causal,
            config=cfg,
        )[None, None]

    pspec = type(params)(P(), P(), P(), P())
    f = jax.shard_map(body, mesh=lay.mesh, in_specs=(spec, spec, spec, pspec), out_specs=spec)
    args = (put(lay.mesh, a, spec) for a in (x, lengths, seg))
    return f, tuple(args), params, x, lengths, seg


def ulysses_reference(params, x, lengths, seg, causal: bool):
    """Per data group: the devices' valid rows concatenated, attended densely, split back."""
    out = []
    for g in range(x.shape[0]):
        keep = np.arange(L)[None, :] < lengths[g][:, None]
        seq = jnp.asarray(x[g][keep])
        y = attention_reference(
            seq, params, heads=HEADS, segment_ids=jnp.asarray(seg[g][keep]), causal=causal
        )
        full = jnp.zeros((x.shape[1] * L, DA)).at[np.flatnonzero(keep.reshape(-1))].set(y)
        out.append(full.reshape(x.shape[1], L, DA))
    return jnp.stack(out)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_ulysses_matches_dense_reference(lay: Layout, causal: bool) -> None:
    f, (xs, ns, ss), params, x, lengths, seg = ulysses_case(lay, 7, causal)
    y = jax.jit(f)(xs, ns, ss, params)
    want = ulysses_reference(params, x, lengths, seg, causal)
    assert_close(y, want, "forward")
    v = np.random.default_rng(8).standard_normal(x.shape).astype(np.float32)
    vs = put(lay.mesh, v, lay.blocks)
    got = jax.jit(jax.grad(lambda xa, pa: (f(xa, ns, ss, pa) * vs).sum(), argnums=(0, 1)))(
        xs, params
    )
    want = jax.grad(
        lambda xa, pa: (ulysses_reference(pa, xa, lengths, seg, causal) * v).sum(), argnums=(0, 1)
    )(jnp.asarray(x), params)
    assert_close(got[0], want[0], "d x")
    for name in ("wq", "wk", "wv", "wo"):
        assert_close(getattr(got[1], name), getattr(want[1], name), f"d {name}")


def test_ulysses_refuses_heads_that_do_not_split() -> None:
    lay = layout((8,))
    cfg = configure(devices=8, timeout_s=30.0)
    params = init_attention(0, DA, 4, HD)

    def body(xb):
        return ulysses_attention(xb, L, params, axis_name="m", heads=4, config=cfg)

    f = jax.jit(jax.shard_map(body, mesh=lay.mesh, in_specs=P("m"), out_specs=P("m")))
    with pytest.raises(VarioPathError, match="4 heads do not split over the 8 devices"):
        f(put(lay.mesh, np.zeros((8 * L, DA), np.float32), P("m")))


def test_a_transposed_demand_runs_the_cached_plan_reversed() -> None:
    """all_to_all_v of D, then of Dᵀ: the second call plans nothing and executes the first's
    transfers reversed (same steps, bytes and order), and delivers the right rows."""
    from variopath_jax.jax_ops import all_to_all_v, last_schedule

    # a fresh, empty plan cache; signal-driven Algorithm 2 (no decision ahead: the second call
    # would apply the one made from the first's demand, not the first's plan)
    cfg = configure(devices=8, timeout_s=30.0, debug=True, execution="signal")
    mesh = jax.make_mesh((8,), ("m",), axis_types=(EXPLICIT,))
    rng = np.random.default_rng(21)
    counts = rng.integers(0, 4, size=(8, 8)).astype(np.int32)
    counts[2, 5] = 9  # not symmetric
    rows = 40

    def exchange(c):
        def body(xb, cb):
            return all_to_all_v(xb, cb[0], axis_name="m", out_capacity=rows, config=cfg)[0]

        f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("m"), P("m")), out_specs=P("m")))
        x = np.arange(8 * rows * 3, dtype=np.float32).reshape(8 * rows, 3)
        before = np.asarray(plan_counts())
        y = np.asarray(f(put(mesh, x, P("m")), put(mesh, c, P("m"))))
        want = np.zeros((8, rows, 3), np.float32)
        blocks = x.reshape(8, rows, 3)
        for j in range(8):
            got_rows = [blocks[i, c[i, :j].sum() : c[i, : j + 1].sum()] for i in range(8)]
            block = np.concatenate(got_rows)
            want[j, : len(block)] = block
        np.testing.assert_array_equal(y.reshape(8, rows, 3), want)
        return np.asarray(plan_counts()) - before, last_schedule()

    first, log = exchange(counts)
    second, back = exchange(counts.T.copy())
    assert tuple(first) == (1, 0, 0) and tuple(second) == (0, 0, 1)
    np.testing.assert_array_equal(back["demand"].reshape(8, 8), log["demand"].reshape(8, 8).T)
    np.testing.assert_array_equal(back["src"], log["dst"])
    np.testing.assert_array_equal(back["dst"], log["src"])
    np.testing.assert_array_equal(back["bytes"], log["bytes"])
    np.testing.assert_array_equal(back["step_ptr"], log["step_ptr"])
    assert back["plan"] == log["plan"]
