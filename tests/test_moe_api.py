"""MoE from the router's output (issue 53 item 4) on 8 forced CPU host devices, against dense
single-device references, forward and gradients, on an (8,) mesh (the functions, a capacity
that drops) and a (2, 4) one (the block, two expert groups; dropless runs in test_layers and
test_nnx): ``moe_dispatch`` of top-k expert ids and gates with any leading batch axes, its
``RoutingHandle`` consumed by ``moe_combine``; the capacity rule against a NumPy oracle (which slots are kept, how many
dropped); ``moe_block`` with its default capacity factor, shared experts, the load-balancing
loss and the router z-loss; the chunked expert FFN; bad arguments."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P
from test_layers import Layout, assert_close, layout, put

from variopath_jax.errors import VarioPathError
from variopath_jax.jax_ops import (
    RoutingHandle,
    configure,
    moe_combine,
    moe_dispatch,
    receive_capacity,
)
from variopath_jax.layers import init_moe, moe_block, moe_reference
from variopath_jax.layers.moe import expert_ffn, route, router_losses

pytestmark = pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 host devices")
B, S, D, F, LOCAL, K = 2, 3, 8, 12, 2, 2  # per device: B x S tokens; width, FFN, experts, top-k
T = B * S


def kept_oracle(ids: np.ndarray, n: int, cap: int | None) -> np.ndarray:
    """One expert group's kept slots: ids (n, T·K) per device, token-major. Each device sends its
    slots sorted by expert (stably); receiver j keeps the first ``cap`` rows, sources in rank
    order, within a source in the order sent."""
    kept = np.ones(ids.shape, bool)
    if cap is None:
        return kept
    room = np.full(n, cap)
    for i in range(n):
        for slot in np.argsort(ids[i], kind="stable"):
            j = ids[i, slot] // LOCAL
            kept[i, slot] = room[j] > 0
            room[j] -= kept[i, slot]
    return kept


def case(lay: Layout, seed: int, shared_ff: int = 0):
    params = init_moe(seed, D, F, lay.n * LOCAL, shared_ff=shared_ff)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((lay.dp * lay.n * B, S, D)).astype(np.float32)
    v = rng.standard_normal(x.shape).astype(np.float32)
    espec = P(lay.model)
    pspec = type(params)(P(), espec, espec, *((P(), P()) if shared_ff else ()))
    ps = jax.tree.map(lambda a, s: put(lay.mesh, a, s), params, pspec)
    return params, pspec, ps, x, v


def group_oracle(lay: Layout, params, x: np.ndarray, cap: int | None) -> np.ndarray:
    """Kept slots (dp·n·B, S, K) of every expert group."""
    ids = np.asarray(route(jnp.asarray(x), params.router, K)[0])  # (dp·n·B, S, K)
    per = ids.reshape(lay.dp, lay.n, T * K)
    kept = np.stack([kept_oracle(per[g], lay.n, cap) for g in range(lay.dp)])
    return kept.reshape(ids.shape)


@pytest.mark.parametrize("shape,dropless", [((8,), False)], ids=["8-capacity"])
def test_dispatch_and_combine_from_the_router_output(shape, dropless: bool) -> None:
    """Top-k ids and gates with leading (B, S) axes in; the handle carries the plan to the
    combine; forward and gradients (tokens and every weight) equal the dense reference with the
    oracle's slots dropped."""
    lay = layout(shape)
    cfg = configure(devices=lay.n, timeout_s=30.0)
    params, pspec, ps, x, v = case(lay, seed=11)
    cf = None if dropless else 1.0  # a factor of 1: some slots past the buffer

    def body(xb, pb):
        ids, gates = route(xb, pb.router, K)
        rows, sizes, h = moe_dispatch(
            xb,
            ids,
            gates,
            axis_name=lay.model,
            num_experts=lay.n * LOCAL,
            capacity_factor=cf,
            dropless=dropless,
            config=cfg,
        )
        assert isinstance(h, RoutingHandle) and h.batch_shape == (B, S) and h.top_k == K
        assert rows.shape[0] == h.capacity == (lay.n * T * K if dropless else T * K)
        assert sizes.shape == (LOCAL,)
        y = moe_combine(expert_ffn(rows, pb.w1, pb.w2, sizes), h)
        return y, h.kept, h.dropped[None]

    f = jax.shard_map(
        body,
        mesh=lay.mesh,
        in_specs=(lay.tokens, pspec),
        out_specs=(lay.tokens, lay.tokens, lay.tokens),
    )
    xs, vs = put(lay.mesh, x, lay.tokens), put(lay.mesh, v, lay.tokens)
    y, kept, dropped = jax.jit(f)(xs, ps)
    want_kept = group_oracle(lay, params, x, None if dropless else T * K)
    np.testing.assert_array_equal(np.asarray(kept), want_kept)
    np.testing.assert_array_equal(
        np.asarray(dropped), (~want_kept).reshape(lay.dp * lay.n, -1).sum(axis=1)
    )
    assert dropless == bool(want_kept.all())  # the capacity case drops some
    assert_close(y, moe_reference(x, params, top_k=K, kept=want_kept), "forward")

    got = jax.jit(jax.grad(lambda a, p: (f(a, p)[0] * vs).sum(), argnums=(0, 1)))(xs, ps)
    want = jax.grad(
        lambda a, p: (moe_reference(a, p, top_k=K, kept=want_kept) * v).sum(), argnums=(0, 1)
    )(x, params)
    assert_close(got[0], want[0], "d x")
    for name in ("router", "w1", "w2"):
        assert_close(getattr(got[1], name), getattr(want[1], name), f"d {name}")


@pytest.mark.parametrize("shape", [(2, 4)], ids=["2x4"])
def test_moe_block_losses_and_shared_experts(shape) -> None:
    """moe_block with its default capacity factor (1.25), shared experts and a (B, S) batch:
    output, dropped slots, the balancing loss and the z-loss of each expert group, and the
    gradient of a loss that weighs all three, against the dense reference."""
    lay = layout(shape)
    cfg = configure(devices=lay.n, timeout_s=30.0)
    params, pspec, ps, x, v = case(lay, seed=5, shared_ff=6)
    a_aux, a_z = 0.3, 0.05

    def body(xb, pb):
        y, st = moe_block(xb, pb, axis_name=lay.model, top_k=K, config=cfg)
        assert st.capacity == receive_capacity(T, K, lay.n) == int(np.ceil(1.25 * T * K))
        assert st.router_probs.shape == (B, S, lay.n * LOCAL)
        return y, st.kept, jnp.stack([st.aux_loss, st.z_loss, st.dropped_slots])[None]

    f = jax.shard_map(
        body,
        mesh=lay.mesh,
        in_specs=(lay.tokens, pspec),
        out_specs=(lay.tokens, lay.tokens, lay.tokens),
    )
    xs, vs = put(lay.mesh, x, lay.tokens), put(lay.mesh, v, lay.tokens)
    y, kept, scalars = jax.jit(f)(xs, ps)
    want_kept = group_oracle(lay, params, x, receive_capacity(T, K, lay.n))
    np.testing.assert_array_equal(np.asarray(kept), want_kept)
    scalars = np.asarray(scalars).reshape(lay.dp, lay.n, 3)
    groups = x.reshape(lay.dp, lay.n * B, S, D)
    for g in range(lay.dp):
        aux, z = router_losses(jnp.asarray(groups[g]), params.router, top_k=K)
        assert_close(scalars[g, :, 0], np.full(lay.n, aux), "balancing loss")
        assert_close(scalars[g, :, 1], np.full(lay.n, z), "z-loss")
    dropped = (~want_kept).reshape(lay.dp, lay.n, -1).sum(axis=2)
    np.testing.assert_array_equal(scalars[..., 2], dropped)
    assert_close(y, moe_reference(x, params, top_k=K, kept=want_kept), "forward")

    def loss(a, p):
        out, _, sc = f(a, p)
        return (out * vs).sum() + (a_aux * sc[:, 0] + a_z * sc[:, 1]).sum() / lay.n

    def ref_loss(a, p):
        total = (moe_reference(a, p, top_k=K, kept=want_kept) * v).sum()
        for g in range(lay.dp):
            aux, z = router_losses(a.reshape(lay.dp, -1, S, D)[g], p.router, top_k=K)
            total = total + a_aux * aux + a_z * z
        return total

    got = jax.jit(jax.grad(loss, argnums=(0, 1)))(xs, ps)
    want = jax.grad(ref_loss, argnums=(0, 1))(jnp.asarray(x), params)
    assert_close(got[0], want[0], "d x")
    for name in ("router", "w1", "w2", "shared_w1", "shared_w2"):
        assert_close(getattr(got[1], name), getattr(want[1], name), f"d {name}")


def test_balancing_loss_is_one_when_balanced_and_the_experts_count_when_not() -> None:
    """Switch's loss: E · Σ f_e P_e; uniform router probabilities give exactly 1."""
    x = jnp.ones((8, 4))
    aux, z = router_losses(x, jnp.zeros((4, 8)), top_k=2)
    np.testing.assert_allclose(float(aux), 1.0, rtol=1e-6)
    np.testing.assert_allclose(float(z), np.log(8.0) ** 2, rtol=1e-6)
    router = jnp.zeros((4, 8)).at[:, 0].set(5.0)  # every token prefers expert 0
    assert float(router_losses(x, router, top_k=1)[0]) > 4.0


def test_the_chunked_expert_ffn_skips_nothing_it_needs() -> None:
    """expert_ffn in chunks (one skipped whole, one cut by the end of the received rows) equals
    one ragged_dot over the buffer, forward and backward."""
    rng = np.random.default_rng(2)
    rows = jnp.asarray(rng.standard_normal((40, D)), jnp.float32)
    w1 = jnp.asarray(rng.standard_normal((3, D, F)), jnp.float32)
    w2 = jnp.asarray(rng.standard_normal((3, F, D)), jnp.float32)
    sizes = jnp.asarray([5, 0, 14], jnp.int32)  # 19 rows received of 40
    rows = rows.at[19:].set(0.0)
    whole = expert_ffn(rows, w1, w2, sizes)
    chunked = expert_ffn(rows, w1, w2, sizes, chunk_rows=8)
    assert_close(chunked, whole, "forward")
    np.testing.assert_array_equal(np.asarray(chunked[24:]), 0.0)
    grads = [
        jax.grad(lambda r, a, b, c=c: (expert_ffn(r, a, b, sizes, c) ** 2).sum(), (0, 1, 2))(
            rows, w1, w2
        )
        for c in (None, 8)
    ]
    for name, g, w in zip(("d rows", "d w1", "d w2"), grads[1], grads[0], strict=True):
        assert_close(g, w, name)


def test_capacity_and_bad_arguments() -> None:
    assert receive_capacity(6, 2, 8) == 15
    assert receive_capacity(6, 2, 8, capacity_factor=2.0) == 24
    assert receive_capacity(6, 2, 8, dropless=True) == 96
    assert receive_capacity(6, 2, 8, capacity=7) == 7
    with pytest.raises(VarioPathError, match="not both"):
        receive_capacity(6, 2, 8, capacity=7, capacity_factor=1.0)
    with pytest.raises(VarioPathError, match="pass no capacity"):
        receive_capacity(6, 2, 8, capacity=7, dropless=True)
    with pytest.raises(VarioPathError, match="capacity_factor must be > 0"):
        receive_capacity(6, 2, 8, capacity_factor=0.0)

    lay = layout((8,))
    cfg = configure(devices=8, timeout_s=30.0)
    xs = put(lay.mesh, np.zeros((8 * T, D), np.float32), P("m"))
    ids = put(lay.mesh, np.zeros((8 * T, K), np.int32), P("m"))

    def run(body):
        f = jax.shard_map(body, mesh=lay.mesh, in_specs=(P("m"), P("m")), out_specs=P("m"))
        return jax.jit(f)(xs, ids)

    with pytest.raises(VarioPathError, match="num_experts=12 does not split over the 8 ranks"):
        run(lambda x, i: moe_dispatch(x, i, axis_name="m", num_experts=12, config=cfg)[0])
    with pytest.raises(VarioPathError, match=r"needs num_experts="):
        run(lambda x, i: moe_dispatch(x, i, i, axis_name="m", config=cfg).rows)
    with pytest.raises(VarioPathError, match="expert ids must be an integer array of shape"):
        run(lambda x, i: moe_dispatch(x, i[:-1], axis_name="m", num_experts=8, config=cfg)[0])

    def wrong_rows(x, i):
        rows, _, h = moe_dispatch(x, i, axis_name="m", num_experts=8, capacity=9, config=cfg)
        return moe_combine(rows[:-1], h)

    with pytest.raises(VarioPathError, match="must have the 9 rows of the dispatched rows"):
        run(wrong_rows)
