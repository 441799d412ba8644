"""moe_dispatch with per-node deduplication (``token_ids``, issue 30) on 8 forced CPU devices:
the same results as the plain path (rows, counts, combine) and the same gradient with respect to
the tokens, for several node sizes; bad arguments."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from variopath_jax.errors import VarioPathError
from variopath_jax.jax_ops import configure, moe_combine, moe_dispatch

N, E, T, K = 8, 3, 10, 4  # ranks, local experts per rank, tokens per rank, experts per token
pytestmark = pytest.mark.skipif(jax.device_count() < N, reason="needs 8 host devices")


@pytest.fixture(scope="module")
def mesh():
    configure(devices=N)
    return jax.make_mesh((N,), ("x",), axis_types=(jax.sharding.AxisType.Explicit,))


def routing(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Per rank: token_ids (R,) of the rows sorted by (destination rank, local expert), padded
    with rows past the counts, and the counts (N, E)."""
    rng = np.random.default_rng(seed)
    rows = T * K + 3
    ids = np.zeros((N, rows), np.int32)
    counts = np.zeros((N, N, E), np.int32)
    for src in range(N):
        pairs = []
        for t in range(T):
            for expert in rng.choice(N * E, size=K, replace=False):
                pairs.append((expert // E, expert % E, t))
        pairs.sort()
        ids[src, : len(pairs)] = [t for *_, t in pairs]
        ids[src, len(pairs) :] = rng.integers(0, T, size=rows - len(pairs))  # ignored rows
        for j, e, _ in pairs:
            counts[src, j, e] += 1
    return ids, counts


def layer(mesh, dedup: bool, m: int | None, cap: int):
    """tokens, ids, counts, weights -> (combined rows, dispatched fields), per rank."""

    def body(tok, ids, cnt, w):
        ids, cnt = ids[0], cnt[0]
        x = jnp.take(tok[0], ids, axis=0)
        d = moe_dispatch(
            x,
            cnt,
            axis_name="x",
            out_capacity=cap,
            token_ids=ids if dedup else None,
            gpus_per_node=m,
        )
        out = moe_combine(d.rows * w[0], d)
        return (
            out[None],
            d.rows[None],
            d.group_sizes[None],
            d.recv_counts[None],
            d.combine_index[None],
        )

    return jax.shard_map(body, mesh=mesh, in_specs=(P("x"),) * 4, out_specs=(P("x"),) * 5)


@pytest.mark.parametrize("m", [2, 4, 8])
def test_dedup_dispatch_equals_plain_dispatch(mesh, m: int) -> None:
    ids, counts = routing(m)
    cap = 2 * T * K
    rng = np.random.default_rng(7)
    tokens = rng.standard_normal((N, T, 5)).astype(np.float32)
    weights = rng.standard_normal((N, cap, 5)).astype(np.float32)
    put = lambda a: jax.device_put(a, NamedSharding(mesh, P("x")))  # noqa: E731
    args = [put(a) for a in (tokens, ids, counts, weights)]
    plain = jax.jit(layer(mesh, False, None, cap))(*args)
    deduped = jax.jit(layer(mesh, True, m, cap))(*args)
    for a, b in zip(plain, deduped, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

    def loss(dedup: bool):
        f = layer(mesh, dedup, m if dedup else None, cap)
        return jax.jit(jax.grad(lambda tok: jnp.sum(f(tok, *args[1:])[0] ** 2)))

    np.testing.assert_allclose(
        np.asarray(loss(True)(args[0])), np.asarray(loss(False)(args[0])), rtol=1e-5, atol=1e-5
    )


def test_dedup_dispatch_checks_its_arguments(mesh) -> None:
    put = lambda a: jax.device_put(a, NamedSharding(mesh, P("x")))  # noqa: E731
    x = put(np.zeros((N * 4, 2), np.float32))
    cnt = put(np.zeros((N * N, 1), np.int32))

    def call(**kw):
        f = jax.shard_map(
            lambda xb, cb: moe_dispatch(xb, cb, axis_name="x", **kw).rows,
            mesh=mesh,
            in_specs=(P("x"), P("x")),
            out_specs=P("x"),
        )
        return f(x, cnt)

    with pytest.raises(VarioPathError, match="token_ids must be"):
        call(token_ids=jnp.zeros(3, jnp.int32), gpus_per_node=4)
    with pytest.raises(VarioPathError, match="nodes of 3"):
        call(token_ids=jnp.zeros(4, jnp.int32), gpus_per_node=3)
    with pytest.raises(VarioPathError, match="drop_overflow"):
        call(token_ids=jnp.zeros(4, jnp.int32), gpus_per_node=4, drop_overflow=True)


def test_dedup_sends_each_token_once_per_node(mesh, monkeypatch) -> None:
    """The exchange to the relays carries, from rank i to the relay of node n, one row per token
    of i with a destination on n (the executed demand, ``configure(debug=True)``)."""
    from variopath_jax.jax_ops import last_schedule, ops

    m = 4
    ids, counts = routing(11)
    config = configure(devices=N, debug=True)
    sites: list[int] = []
    attrs = ops._attrs

    def spy(ctx, target, params):
        out = attrs(ctx, target, params)
        sites.append(int(out["site"]))
        return out

    monkeypatch.setattr(ops, "_attrs", spy)
    put = lambda a: jax.device_put(a, NamedSharding(mesh, P("x")))  # noqa: E731
    tokens = put(np.ones((N, T, 5), np.float32))

    def body(tok, i, c):
        x = jnp.take(tok[0], i[0], axis=0)
        d = moe_dispatch(
            x,
            c[0],
            axis_name="x",
            out_capacity=2 * T * K,
            token_ids=i[0],
            gpus_per_node=m,
            config=config,
        )
        return d.rows[None]

    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("x"),) * 3, out_specs=P("x")))
    f(tokens, put(ids), put(counts)).block_until_ready()
    configure(devices=N)
    assert len(sites) == 3  # which row is which token, the unique rows, the fan-out
    demand = np.asarray(last_schedule(sites[1])["demand"]).reshape(N, N)
    expect = np.zeros((N, N), np.int64)
    for i in range(N):
        sent = counts[i].sum(axis=1)
        dest = np.repeat(np.arange(N), sent)
        for n in range(N // m):
            relay = n * m + i % m
            if relay != i:
                expect[i, relay] = len(set(ids[i, : len(dest)][dest // m == n])) * 5 * 4
    np.testing.assert_array_equal(demand, expect)
    plain_inter = sum(
        counts[i, j].sum() * 20 for i in range(N) for j in range(N) if i // m != j // m
    )
    assert 0 < expect[np.arange(N)[:, None] // m != np.arange(N)[None, :] // m].sum() < plain_inter
