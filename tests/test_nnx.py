"""The Flax NNX modules (variopath_jax.nnx) on 8 forced CPU host devices, against the dense
single-device references, forward and gradients (``nnx.grad``): ``MoEBlock`` on an (8,) mesh
(shared experts, the balancing and z-losses, dropless; the capacity path of the same code is
tested on (2, 4) in test_moe_api), ``UlyssesAttention`` on a (2, 4) mesh (two sequences per
data group, uneven chunks, packed documents). Skipped where flax is not installed (the
``flax`` extra; ``test`` installs it)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P
from test_layers import DA, HD, HEADS, L, assert_close, layout, put, ulysses_reference
from test_moe_api import group_oracle

from variopath_jax.jax_ops import configure
from variopath_jax.layers import moe_reference
from variopath_jax.layers.moe import router_losses

nnx = pytest.importorskip("flax.nnx", reason="flax is not installed (pip install '.[flax]')")
vnnx = pytest.importorskip("variopath_jax.nnx")
pytestmark = pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 host devices")
B, S, D, F, LOCAL, K = 2, 3, 8, 12, 2, 2


@pytest.mark.parametrize("shape,dropless", [((8,), True)], ids=["8-dropless"])
def test_moe_block_module_matches_dense_reference(shape, dropless: bool) -> None:
    lay = layout(shape)
    cfg = configure(devices=lay.n, timeout_s=30.0)
    model = vnnx.MoEBlock(
        D,
        F,
        lay.n * LOCAL,
        top_k=K,
        mesh=lay.mesh,
        expert_axis=lay.model,
        data_axis=lay.data,
        shared_ff=6,
        dropless=dropless,
        config=cfg,
        rngs=nnx.Rngs(4),
    )
    rng = np.random.default_rng(4)
    x = rng.standard_normal((lay.dp * lay.n * B, S, D)).astype(np.float32)
    v = rng.standard_normal(x.shape).astype(np.float32)
    xs, vs = put(lay.mesh, x, lay.tokens), put(lay.mesh, v, lay.tokens)
    params = model.params()
    cap = None if dropless else int(np.ceil(1.25 * B * S * K))
    kept = group_oracle(lay, params, x, cap)
    assert dropless == bool(kept.all())

    y, aux = nnx.jit(lambda m, a: m(a))(model, xs)
    assert_close(y, moe_reference(x, params, top_k=K, kept=kept), "forward")
    assert int(aux.dropped_slots) == int((~kept).sum())
    groups = x.reshape(lay.dp, -1, S, D)

    def ref_losses(a, router):
        pairs = [router_losses(a.reshape(groups.shape)[g], router, top_k=K) for g in range(lay.dp)]
        return sum(p[0] for p in pairs) / lay.dp, sum(p[1] for p in pairs) / lay.dp

    want_aux, want_z = ref_losses(jnp.asarray(x), params.router)
    assert_close(aux.aux_loss, want_aux, "balancing loss")
    assert_close(aux.z_loss, want_z, "z-loss")

    def loss(m):
        out, a = m(xs)
        return (out * vs).sum() + 0.5 * a.aux_loss + 0.1 * a.z_loss

    def ref_loss(p):
        a, z = ref_losses(jnp.asarray(x), p.router)
        return (moe_reference(x, p, top_k=K, kept=kept) * v).sum() + 0.5 * a + 0.1 * z

    got = nnx.jit(nnx.grad(loss))(model)
    want = jax.grad(ref_loss)(params)
    for name in ("router", "w1", "w2", "shared_w1", "shared_w2"):
        assert_close(got[name][...], getattr(want, name), f"d {name}")


def test_ulysses_module_matches_dense_reference() -> None:
    lay = layout((2, 4))
    cfg = configure(devices=lay.n, timeout_s=30.0)
    model = vnnx.UlyssesAttention(
        DA,
        HEADS,
        HD,
        mesh=lay.mesh,
        seq_axis="m",
        data_axis="d",
        config=cfg,
        rngs=nnx.Rngs(9),
    )
    rng = np.random.default_rng(9)
    seqs = 2 * lay.dp  # two sequences per data group
    lengths = rng.integers(0, L + 1, size=(seqs, lay.n)).astype(np.int32)
    lengths[:, 0] = L
    x = rng.standard_normal((seqs, lay.n, L, DA)).astype(np.float32)
    x = np.where(np.arange(L)[None, None, :, None] < lengths[..., None, None], x, 0)
    seg = np.cumsum(rng.random((seqs, lay.n * L)) < 0.2, axis=-1).astype(np.int32)
    v = rng.standard_normal(x.shape).astype(np.float32)
    spec = P("d", "m")
    flat = x.reshape(seqs, lay.n * L, DA)
    xs = put(lay.mesh, flat, spec)
    ns, ss = put(lay.mesh, lengths, spec), put(lay.mesh, seg, spec)
    vs = put(lay.mesh, v.reshape(flat.shape), spec)
    params = model.params()
    seg4 = seg.reshape(seqs, lay.n, L)

    y = nnx.jit(lambda m, a, n, s: m(a, n, s))(model, xs, ns, ss)
    want = ulysses_reference(params, x, lengths, seg4, True)
    assert_close(y, want.reshape(flat.shape), "forward")

    got = nnx.jit(nnx.grad(lambda m: (m(xs, ns, ss) * vs).sum()))(model)
    ref = jax.grad(lambda p: (ulysses_reference(p, x, lengths, seg4, True) * v).sum())(params)
    for name in ("wq", "wk", "wv", "wo"):
        assert_close(got[name][...], getattr(ref, name), f"d {name}")
