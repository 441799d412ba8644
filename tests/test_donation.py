"""Buffers reused across steps (issue 30): the exchange writes into a caller's donated output.

``ragged_all_to_all``'s ``output`` operand and ``all_to_all_v``'s ``out=`` are aliased to the
result; in a jitted step that donates them, every device's result lands in the very buffer it was
given (the same address step after step), results equal NumPy's, and the rows no slice writes
keep ``output``'s values."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from variopath_jax.errors import VarioPathError
from variopath_jax.jax_ops import all_to_all_v, ragged_all_to_all

N = 8
pytestmark = pytest.mark.skipif(jax.device_count() < N, reason="needs 8 host devices (XLA_FLAGS)")


@pytest.fixture(scope="module")
def mesh():
    return jax.make_mesh((N,), ("x",), axis_types=(jax.sharding.AxisType.Explicit,))


def shard(mesh, a):
    return jax.device_put(a, NamedSharding(mesh, P("x")))


def owned(mesh, a: np.ndarray) -> jax.Array:
    """``a`` sharded in buffers XLA allocated (``device_put`` of a NumPy array may wrap the
    array's own memory on CPU, which XLA cannot donate and copies instead)."""
    return jax.jit(lambda v: v + 0, out_shardings=NamedSharding(mesh, P("x")))(shard(mesh, a))


def values(a: jax.Array) -> np.ndarray:
    """``a``'s values, read shard by shard through fresh single-device arrays. Not
    ``np.asarray(a)``: under jax 0.11 on CPU that pins the shards' buffers (the host view stays
    with the array), so the next step that donates ``a`` gets a copy instead of its buffer (a
    plain ``x * 2 + out`` step does the same: it is jax's, not the op's)."""
    shards = sorted(a.addressable_shards, key=lambda s: s.device.id)
    return np.concatenate([np.asarray(s.data) for s in shards])


def addresses(a: jax.Array) -> list[int]:
    """Every device's buffer address, in device order."""
    shards = sorted(a.addressable_shards, key=lambda s: s.device.id)
    return [s.data.unsafe_buffer_pointer() for s in shards]


def a2av_oracle(x: np.ndarray, counts: np.ndarray, cap: int) -> np.ndarray:
    """x: (N, R, ...) per-rank rows; counts[i, j] rows from i to j; zero past the received."""
    y = np.zeros((N, cap, *x.shape[2:]), dtype=x.dtype)
    for j in range(N):
        got = np.concatenate(
            [x[i, counts[i, :j].sum() : counts[i, :j].sum() + counts[i, j]] for i in range(N)]
        )
        y[j, : len(got)] = got
    return y


def test_all_to_all_v_into_donated_buffer_keeps_its_address(mesh) -> None:
    rows, cap, steps = 16, 40, 4
    rng = np.random.default_rng(30)

    def body(xb, cb, ob):
        y, _ = all_to_all_v(xb, cb[0], axis_name="x", out=ob)
        return y

    step = jax.jit(
        jax.shard_map(body, mesh=mesh, in_specs=(P("x"), P("x"), P("x")), out_specs=P("x")),
        donate_argnums=2,
    )
    out = owned(mesh, np.full((N * cap, 3), 7.0, np.float32))  # never read: overwritten
    first = addresses(out)
    for s in range(steps):
        counts = rng.integers(0, 3, size=(N, N))  # <= 16 rows to send
        x = rng.standard_normal((N, rows, 3)).astype(np.float32)
        out = step(shard(mesh, x.reshape(N * rows, 3)), shard(mesh, counts.astype(np.int32)), out)
        assert addresses(out) == first, f"step {s}: the result left the donated buffer"
        np.testing.assert_array_equal(values(out).reshape(N, cap, 3), a2av_oracle(x, counts, cap))


def test_all_to_all_v_into_without_donation_leaves_the_buffer_alone(mesh) -> None:
    rows = 8
    rng = np.random.default_rng(31)
    counts = rng.integers(0, 2, size=(N, N))
    x = rng.standard_normal((N, rows, 2)).astype(np.float32)
    keep = np.full((N * rows, 2), -1.0, np.float32)
    out = shard(mesh, keep)
    f = jax.jit(
        jax.shard_map(
            lambda xb, cb, ob: all_to_all_v(xb, cb[0], axis_name="x", out=ob)[0],
            mesh=mesh,
            in_specs=(P("x"), P("x"), P("x")),
            out_specs=P("x"),
        )
    )
    y = f(shard(mesh, x.reshape(N * rows, 2)), shard(mesh, counts.astype(np.int32)), out)
    np.testing.assert_array_equal(np.asarray(y).reshape(N, rows, 2), a2av_oracle(x, counts, rows))
    np.testing.assert_array_equal(np.asarray(out), keep)  # not donated: copied, untouched


def test_all_to_all_v_into_gradient_equals_the_fresh_output_path(mesh) -> None:
    rows = 16
    rng = np.random.default_rng(32)
    counts = shard(mesh, rng.integers(0, 3, size=(N, N)).astype(np.int32))
    x = shard(mesh, rng.standard_normal((N * rows, 2)).astype(np.float32))
    w = shard(mesh, rng.standard_normal((N * rows, 2)).astype(np.float32))

    def loss(into: bool):
        def body(xb, cb, wb):
            out = jnp.zeros_like(xb) if into else None
            y, _ = all_to_all_v(xb * xb, cb[0], axis_name="x", out=out)
            return jnp.sum(y * wb)[None]

        f = jax.shard_map(body, mesh=mesh, in_specs=(P("x"), P("x"), P("x")), out_specs=P("x"))
        return jax.jit(jax.grad(lambda xb: f(xb, counts, w).sum()))

    np.testing.assert_array_equal(np.asarray(loss(True)(x)), np.asarray(loss(False)(x)))


def test_all_to_all_v_into_checks_the_buffer(mesh) -> None:
    def call(out_shape, dtype=jnp.float32, **kw):
        def body(xb, cb):
            return all_to_all_v(xb, cb[0], axis_name="x", out=jnp.zeros(out_shape, dtype), **kw)[0]

        f = jax.shard_map(body, mesh=mesh, in_specs=(P("x"), P("x")), out_specs=P("x"))
        return f(
            shard(mesh, np.zeros((N * 4, 3), np.float32)), shard(mesh, np.zeros((N, N), np.int32))
        )

    with pytest.raises(VarioPathError, match="trailing shape"):
        call((4, 2))
    with pytest.raises(VarioPathError, match="dtype"):
        call((4, 3), jnp.int32)
    with pytest.raises(VarioPathError, match="out_capacity=5"):
        call((4, 3), out_capacity=5)


def ragged_plan(rng: np.random.Generator, rows: int, cap: int):
    """Per rank: one slice to each peer, sizes and sender-side output offsets that leave gaps."""
    send = rng.integers(0, 3, size=(N, N))  # send[i, j] rows from i to j
    in_off = np.concatenate([np.zeros((N, 1), int), np.cumsum(send, axis=1)[:, :-1]], axis=1)
    # at receiver j, slice from i lands at 4·i + 1 (gaps of >= 1 row stay untouched)
    out_off = np.broadcast_to(4 * np.arange(N)[:, None] + 1, (N, N)).copy()
    recv = send.T.copy()
    assert (send <= 3).all() and cap >= 4 * N + 1 and send.sum(axis=1).max() <= rows
    return send, in_off, out_off, recv


def ragged_oracle(operand, output, send, in_off, out_off) -> np.ndarray:
    result = output.copy()
    for i in range(N):
        for j in range(N):
            k = send[i, j]
            result[j, out_off[i, j] : out_off[i, j] + k] = operand[
                i, in_off[i, j] : in_off[i, j] + k
            ]
    return result


def test_ragged_all_to_all_donated_output_keeps_address_and_unwritten_rows(mesh) -> None:
    rows, cap, steps = 24, 40, 4
    rng = np.random.default_rng(33)

    def body(op, ob, a, b, c, d):
        return ragged_all_to_all(op, ob, a[0], b[0], c[0], d[0], axis_name="x")

    step = jax.jit(
        jax.shard_map(body, mesh=mesh, in_specs=(P("x"),) * 6, out_specs=P("x")),
        donate_argnums=1,
    )
    expect = rng.standard_normal((N, cap, 2)).astype(np.float32)  # the rows nobody writes
    out = owned(mesh, expect.reshape(N * cap, 2))
    first = addresses(out)
    for s in range(steps):
        send, in_off, out_off, recv = ragged_plan(rng, rows, cap)
        operand = rng.standard_normal((N, rows, 2)).astype(np.float32)
        ints = [shard(mesh, a.astype(np.int32)) for a in (in_off, send, out_off, recv)]
        out = step(shard(mesh, operand.reshape(N * rows, 2)), out, *ints)
        assert addresses(out) == first, f"step {s}: the result left the donated buffer"
        expect = ragged_oracle(operand, expect, send, in_off, out_off)
        np.testing.assert_array_equal(values(out).reshape(N, cap, 2), expect)


def test_all_to_all_v_into_under_vmap_and_linear_transpose(mesh) -> None:
    """``out=`` under ``vmap`` (a batch of exchanges) and under ``jax.linear_transpose`` (the
    exchange's own transpose rule) gives what the fresh-output path gives."""
    rows, batch = 16, 3
    rng = np.random.default_rng(34)
    counts = shard(mesh, rng.integers(0, 3, size=(N, N)).astype(np.int32))
    x = shard(mesh, rng.standard_normal((N * batch, rows, 2)).astype(np.float32))

    def batched(into: bool):
        def body(xb, cb):
            def one(xe):
                out = jnp.zeros_like(xe) if into else None
                return all_to_all_v(xe, cb[0], axis_name="x", out=out)[0]

            return jax.vmap(one)(xb)

        return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("x"), P("x")), out_specs=P("x")))

    np.testing.assert_array_equal(
        np.asarray(batched(True)(x, counts)), np.asarray(batched(False)(x, counts))
    )
    x1 = shard(mesh, rng.standard_normal((N * rows, 2)).astype(np.float32))

    def transposed(into: bool):
        def body(xb, cb):
            def f(v):
                out = jnp.zeros_like(v) if into else None
                return all_to_all_v(v, cb[0], axis_name="x", out=out)[0]

            return jax.linear_transpose(f, xb)(xb)[0]

        return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("x"), P("x")), out_specs=P("x")))

    np.testing.assert_array_equal(
        np.asarray(transposed(True)(x1, counts)), np.asarray(transposed(False)(x1, counts))
    )
