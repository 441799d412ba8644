"""The JAX op as JAX primitives on 8 forced CPU host devices: forward mode, second-order gradients
and linear transposition; tuple axis names and axis_index_groups on 1-, 2- and 3-D meshes against
a NumPy oracle; gradients there; the varying-axes typing of results; vmap (one merged exchange for
ragged_all_to_all, refused over the exchange's own axis); argument errors before the axis lookup."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from jax.test_util import check_grads

from variopath_jax.errors import VarioPathError
from variopath_jax.jax_ops import all_to_all_v, ragged_all_to_all
from variopath_jax.jax_ops import config as op_config
from variopath_jax.jax_ops._compat import varying_axes

D = 8
pytestmark = pytest.mark.skipif(jax.device_count() < D, reason="needs 8 host devices (XLA_FLAGS)")


@pytest.fixture(autouse=True)
def unconfigured(monkeypatch) -> None:
    """As a fresh process: each collective size plans against its default topology."""
    monkeypatch.setattr(op_config, "_current", None)


def make_mesh(shape: dict[str, int]) -> jax.sharding.Mesh:
    auto = (jax.sharding.AxisType.Auto,) * len(shape)
    return jax.make_mesh(tuple(shape.values()), tuple(shape), axis_types=auto)


def collectives(shape: dict[str, int], names, groups=None) -> list[list[int]]:
    """The devices (row-major positions on the mesh) of each collective, in rank order: ranks are
    the linear index over the exchange axes in mesh order, within each index group."""
    names = (names,) if isinstance(names, str) else names
    axes = list(shape)
    members: dict[tuple, dict[int, int]] = {}
    for d, c in enumerate(itertools.product(*(range(n) for n in shape.values()))):
        outer = tuple(c[i] for i, a in enumerate(axes) if a not in names)
        rank = 0
        for i, a in enumerate(axes):
            if a in names:
                rank = rank * shape[a] + c[i]
        members.setdefault(outer, {})[rank] = d
    result = []
    for by_rank in members.values():
        ordered = [by_rank[r] for r in range(len(by_rank))]
        result += [[ordered[i] for i in g] for g in groups] if groups else [ordered]
    return result


# (mesh, axis_name, axis_index_groups)
LAYOUTS = {
    "dp2xep4-ep": ({"dp": 2, "ep": 4}, "ep", None),
    "dp2xep4-both": ({"dp": 2, "ep": 4}, ("dp", "ep"), None),
    "2x2x2-c": ({"a": 2, "b": 2, "c": 2}, "c", None),
    "2x2x2-ca": ({"a": 2, "b": 2, "c": 2}, ("c", "a"), None),
    "x8-groups": ({"x": 8}, "x", ((0, 2, 4, 6), (1, 3, 5, 7))),
    "dp2xep4-groups": ({"dp": 2, "ep": 4}, "ep", ((0, 3), (1, 2))),
}


def per_device(mesh: jax.sharding.Mesh, fn, *arrays, spec=None):
    """Run ``fn`` on each device's block (leading dimension D, one block per device, row-major
    over the mesh) of every array; results stacked the same way."""
    spec = spec or P(tuple(mesh.axis_names))

    def body(*blocks):
        out = fn(*(b[0] for b in blocks))
        return jax.tree.map(lambda o: o[None], out)

    return jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec)(*arrays)


def a2av_case(rng, colls, rows: int, cap: int):
    counts = np.zeros((D, D // len(colls)), np.int64)
    for c in colls:
        for d in c:
            counts[d] = rng.integers(0, rows // len(c) + 1, size=len(c))
    x = rng.standard_normal((D, rows, 2)).astype(np.float32)
    want = np.zeros((D, cap, 2), np.float32)
    want_recv = np.zeros_like(counts)
    for c in colls:
        for j, dj in enumerate(c):
            parts = [x[di, counts[di, :j].sum() : counts[di, : j + 1].sum()] for di in c]
            got = np.concatenate(parts)
            want[dj, : len(got)] = got
            want_recv[dj] = [counts[di, j] for di in c]
    return x, counts.astype(np.int32), want, want_recv


def ragged_case(rng, colls, spd: int, rows: int, cap: int):
    n = len(colls[0])
    send = rng.integers(0, 3, size=(D, n * spd))
    in_off = np.zeros_like(send)
    out_off = np.zeros_like(send)
    recv = np.zeros_like(send)
    for d in range(D):
        in_off[d] = np.concatenate([[0], np.cumsum(send[d])[:-1]])
    for c in colls:  # each receiver lays its slices out in source order, one row apart
        for j, dj in enumerate(c):
            pos = 1
            for i, di in enumerate(c):
                for t in range(spd):
                    out_off[di, j * spd + t] = pos
                    recv[dj, i * spd + t] = send[di, j * spd + t]
                    pos += send[di, j * spd + t] + 1
    operand = rng.standard_normal((D, rows, 2)).astype(np.float32)
    output = rng.standard_normal((D, cap, 2)).astype(np.float32)
    want = output.copy()
    for c in colls:
        for di in c:
            for s in range(n * spd):
                dj = c[s // spd]
                block = operand[di, in_off[di, s] : in_off[di, s] + send[di, s]]
                want[dj, out_off[di, s] : out_off[di, s] + len(block)] = block
    ints = [a.astype(np.int32) for a in (in_off, send, out_off, recv)]
    return operand, output, ints, want


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_all_to_all_v_layouts_match_numpy_and_differentiate(layout: str) -> None:
    shape, names, groups = LAYOUTS[layout]
    mesh = make_mesh(shape)
    colls = collectives(shape, names, groups)
    rng = np.random.default_rng(10)
    rows, cap = 12, 16
    x, counts, want, want_recv = a2av_case(rng, colls, rows, cap)

    def op(xb, cb):
        return all_to_all_v(xb, cb, axis_name=names, out_capacity=cap, axis_index_groups=groups)

    y, recv = jax.jit(lambda a, b: per_device(mesh, op, a, b))(x, counts)
    np.testing.assert_array_equal(np.asarray(y), want)
    np.testing.assert_array_equal(np.asarray(recv), want_recv)
    f = jax.jit(lambda a: per_device(mesh, lambda xb, cb: op(xb, cb)[0], a, counts))
    check_grads(f, (x,), order=1, modes=("fwd", "rev"))


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_ragged_all_to_all_layouts_match_numpy_and_differentiate(layout: str) -> None:
    shape, names, groups = LAYOUTS[layout]
    mesh = make_mesh(shape)
    colls = collectives(shape, names, groups)
    rng = np.random.default_rng(11)
    operand, output, ints, want = ragged_case(rng, colls, spd=2, rows=40, cap=64)

    def op(o, out, *offsets):
        return ragged_all_to_all(o, out, *offsets, axis_name=names, axis_index_groups=groups)

    got = jax.jit(lambda *a: per_device(mesh, op, *a))(operand, output, *ints)
    np.testing.assert_array_equal(np.asarray(got), want)
    f = jax.jit(lambda o, out: per_device(mesh, op, o, out, *ints))
    check_grads(f, (operand, output), order=1, modes=("fwd", "rev"))


def test_tuple_axis_names_follow_mesh_order() -> None:
    """('ep', 'dp') ranks devices as ('dp', 'ep') does: dp-major, as the mesh orders its axes."""
    shape = {"dp": 2, "ep": 4}
    mesh = make_mesh(shape)
    rng = np.random.default_rng(12)
    x, counts, want, _ = a2av_case(rng, collectives(shape, ("dp", "ep")), 12, 16)
    for names in (("dp", "ep"), ("ep", "dp"), ["ep", "dp"]):
        y, _ = jax.jit(
            lambda a, b, names=names: per_device(
                mesh, lambda xb, cb: all_to_all_v(xb, cb, axis_name=names, out_capacity=16), a, b
            )
        )(x, counts)
        np.testing.assert_array_equal(np.asarray(y), want)
    single = make_mesh({"x": D})
    y1, _ = jax.jit(
        lambda a, b: per_device(
            single, lambda xb, cb: all_to_all_v(xb, cb, axis_name=("x",), out_capacity=16), a, b
        )
    )(x, counts)
    np.testing.assert_array_equal(np.asarray(y1), want)


def ragged_unit():
    """JAX's docstring example on a 2-device axis, as (args, result)."""
    operand = np.array([[1, 2, 2], [3, 4, 0]], dtype=np.float32)
    output = np.zeros((2, 4), dtype=np.float32)
    ints = [
        np.array(a, np.int32)
        for a in ([[0, 1], [0, 1]], [[1, 2], [1, 1]], [[0, 0], [1, 2]], [[1, 1], [2, 1]])
    ]
    return operand, output, ints


def two_devices() -> jax.sharding.Mesh:
    auto = (jax.sharding.AxisType.Auto,)
    return jax.make_mesh((2,), ("x",), axis_types=auto, devices=jax.devices()[:2])


def test_ragged_forward_mode_second_order_and_linear_transpose() -> None:
    mesh = two_devices()
    operand, output, ints = ragged_unit()

    def g(o, out):
        return per_device(mesh, lambda *a: ragged_all_to_all(*a, axis_name="x"), o, out, *ints)

    g = jax.jit(g)
    rng = np.random.default_rng(13)
    t_op = rng.standard_normal(operand.shape).astype(np.float32)
    t_out = rng.standard_normal(output.shape).astype(np.float32)
    primal, tangent = jax.jvp(g, (operand, output), (t_op, t_out))
    np.testing.assert_array_equal(np.asarray(primal), [[1, 3, 0, 0], [2, 2, 4, 0]])
    np.testing.assert_array_equal(np.asarray(tangent), np.asarray(g(t_op, t_out)))  # linear
    check_grads(g, (operand, output), order=2, modes=("fwd", "rev"), eps=1e-2)
    ct = rng.standard_normal(output.shape).astype(np.float32)
    transposed = jax.linear_transpose(g, operand, output)(ct)  # no forward pass to reuse
    by_vjp = jax.vjp(g, operand, output)[1](ct)
    for a, b in zip(transposed, by_vjp, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_all_to_all_v_forward_mode_second_order_and_linear_transpose() -> None:
    mesh = make_mesh({"x": D})
    rng = np.random.default_rng(14)
    x, counts, _, _ = a2av_case(rng, collectives({"x": D}, "x"), 12, 16)

    def g(a):
        return per_device(
            mesh, lambda xb, cb: all_to_all_v(xb, cb, axis_name="x", out_capacity=16)[0], a, counts
        )

    g = jax.jit(g)
    t = rng.standard_normal(x.shape).astype(np.float32)
    _, tangent = jax.jvp(g, (x,), (t,))
    np.testing.assert_array_equal(np.asarray(tangent), np.asarray(g(t)))
    check_grads(g, (x,), order=2, modes=("fwd", "rev"), eps=1e-2)
    ct = rng.standard_normal((D, 16, 2)).astype(np.float32)
    (transposed,) = jax.linear_transpose(g, x)(ct)
    (by_vjp,) = jax.vjp(g, x)[1](ct)
    np.testing.assert_array_equal(np.asarray(transposed), np.asarray(by_vjp))


@pytest.mark.parametrize("axis_type", ["Auto", "Explicit"])
@pytest.mark.parametrize("op", ["all_to_all_v", "ragged_all_to_all"])
def test_results_vary_over_the_inputs_axes_and_the_exchange_axis(op: str, axis_type: str) -> None:
    """On (dp, ep) with the exchange over ep: data varying over dp gives results varying over dp
    (jax.grad works); data replicated over dp gives results replicated over dp (returned with
    out_specs P('ep'), and its gradient is the sum over the dp replicas)."""
    types = (getattr(jax.sharding.AxisType, axis_type),) * 2
    mesh = jax.make_mesh((2, 4), ("dp", "ep"), axis_types=types)
    rng = np.random.default_rng(15)
    rows = 8

    def exchange(xb):
        if op == "all_to_all_v":
            return all_to_all_v(xb, jnp.ones(4, jnp.int32), axis_name="ep")[0]
        k = jnp.arange(4, dtype=jnp.int32)
        ones = jnp.ones(4, jnp.int32)
        me = jax.lax.axis_index("ep").astype(jnp.int32)
        return ragged_all_to_all(xb, jnp.zeros_like(xb), k, ones, ones * me, ones, axis_name="ep")

    def body(xb, wb):
        y = exchange(xb)
        assert varying_axes(y) == varying_axes(xb) | {"ep"}
        return jnp.sum(y * wb, keepdims=True)

    both = P(("dp", "ep"))
    for spec, blocks in ((both, D), (P("ep"), 4)):
        x = jax.device_put(
            rng.standard_normal((blocks * rows,)).astype(np.float32), NamedSharding(mesh, spec)
        )
        w = jax.device_put(
            rng.standard_normal((D * rows,)).astype(np.float32), NamedSharding(mesh, both)
        )
        y = jax.jit(jax.shard_map(exchange, mesh=mesh, in_specs=spec, out_specs=spec))(x)
        assert y.shape == x.shape
        loss = jax.shard_map(body, mesh=mesh, in_specs=(spec, both), out_specs=both)
        g = np.asarray(jax.jit(jax.grad(lambda a, b, loss=loss: loss(a, b).sum()))(x, w))
        # every rank sends its row t to rank t and receives rank s's row at position s
        wr = np.asarray(w).reshape(2, 4, rows)
        want = np.zeros((2, 4, rows), np.float32)
        for i in range(4):
            for t in range(4):
                want[:, i, t] = wr[:, t, i]
        want = want.reshape(-1) if blocks == D else want.sum(axis=0).reshape(-1)
        np.testing.assert_allclose(g, want, rtol=1e-6)


def test_ragged_vmap_is_one_exchange_per_batch_and_grad_of_vmap() -> None:
    mesh = two_devices()
    operand, output, ints = ragged_unit()
    batch = 3
    scale = np.arange(1, batch + 1, dtype=np.float32)[:, None, None]
    ops, outs = operand[None] * scale, output[None] + scale

    def body(o, out, *offsets):  # o: (batch, 1, 3) per device
        fn = jax.vmap(lambda a, b: ragged_all_to_all(a[0], b[0], *offsets, axis_name="x")[None])
        return fn(o, out)

    spec = P(None, "x")
    f = jax.jit(
        jax.shard_map(
            lambda o, out, *a: body(o, out, *(v[0] for v in a)),
            mesh=mesh,
            in_specs=(spec, spec) + (P("x"),) * 4,
            out_specs=spec,
        )
    )
    got = np.asarray(f(ops, outs, *ints))
    single = jax.jit(
        lambda o, out: per_device(
            mesh, lambda *a: ragged_all_to_all(*a, axis_name="x"), o, out, *ints
        )
    )
    for b in range(batch):
        np.testing.assert_array_equal(got[b], np.asarray(single(ops[b], outs[b])))
    assert f.lower(ops, outs, *ints).as_text().count("@variopath_ragged_all_to_all") == 1
    w = np.random.default_rng(16).standard_normal(got.shape).astype(np.float32)
    grads = jax.jit(jax.grad(lambda o, out: (f(o, out, *ints) * w).sum(), argnums=(0, 1)))(
        ops, outs
    )
    for b in range(batch):
        one = jax.grad(lambda o, out, b=b: (single(o, out) * w[b]).sum(), argnums=(0, 1))
        for got_g, want_g in zip(grads, one(ops[b], outs[b]), strict=True):
            np.testing.assert_allclose(np.asarray(got_g)[b], np.asarray(want_g))


@pytest.mark.parametrize("op", ["all_to_all_v", "ragged_all_to_all"])
def test_vmap_over_the_exchange_axis_is_refused_at_trace_time(op: str) -> None:
    """Under vmap with axis_name='b' and the exchange over 'b' (a vmap axis, not a mesh axis), or
    over a vmap axis that shadows the mesh axis 'x'."""
    mesh = make_mesh({"x": D})

    def exchange(v, axis):
        if op == "all_to_all_v":
            return all_to_all_v(v, jnp.ones(4, jnp.int32), axis_name=axis)[0]
        ones = jnp.ones(4, jnp.int32)
        return ragged_all_to_all(v, v, ones * 0, ones, ones * 0, ones, axis_name=axis)

    for axis in ("b", "x"):
        fn = jax.vmap(lambda v, axis=axis: exchange(v, axis), axis_name=axis)
        f = jax.jit(
            jax.shard_map(
                lambda v, fn=fn: fn(v[0])[None], mesh=mesh, in_specs=P("x"), out_specs=P("x")
            )
        )
        with pytest.raises(NotImplementedError, match="vmap"):
            f.trace(np.zeros((D, 4, 4), np.float32))


def test_errors() -> None:
    """Argument errors come before the axis lookup (outside any mapped context here); bad groups
    and a topology of the wrong size name what is wrong."""
    x = jnp.zeros((4, 2))
    with pytest.raises(VarioPathError, match="send_counts must be a 1-D integer array"):
        all_to_all_v(x, jnp.zeros(4), axis_name="x")
    with pytest.raises(VarioPathError, match="x needs a leading row axis"):
        all_to_all_v(jnp.float32(1), jnp.zeros(4, jnp.int32), axis_name="x")
    with pytest.raises(VarioPathError, match="must share dtype and trailing shape"):
        ones = jnp.ones(4, jnp.int32)
        ragged_all_to_all(x, jnp.zeros((4, 3)), ones, ones, ones, ones, axis_name="x")
    with pytest.raises(NameError):
        all_to_all_v(x, jnp.zeros(4, jnp.int32), axis_name="x")
    mesh = make_mesh({"x": D})

    def run(fn):
        jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=P("x"), out_specs=P("x"))).trace(
            np.zeros((D * 4, 2), np.float32)
        )

    with pytest.raises(VarioPathError, match="equally sized groups covering the 8 axis indices"):
        run(
            lambda v: all_to_all_v(
                v,
                jnp.ones(4, jnp.int32),
                axis_name="x",
                axis_index_groups=[[0, 1, 2, 3], [4, 5, 6]],
            )[0]
        )
    with pytest.raises(
        VarioPathError, match="send_counts must be an integer array of shape \\(4,\\)"
    ):
        run(
            lambda v: all_to_all_v(
                v,
                jnp.ones(8, jnp.int32),
                axis_name="x",
                axis_index_groups=[[0, 1, 2, 3], [4, 5, 6, 7]],
            )[0]
        )
    with pytest.raises(VarioPathError, match="distinct mesh axes"):
        run(lambda v: all_to_all_v(v, jnp.ones(64, jnp.int32), axis_name=("x", "x"))[0])
    op_config.configure(devices=2)  # monkeypatched back to unconfigured after the test
    with pytest.raises(
        VarioPathError, match="each of the axis_index_groups of mesh axis 'x' has 4 devices"
    ):
        run(
            lambda v: all_to_all_v(
                v,
                jnp.ones(4, jnp.int32),
                axis_name="x",
                axis_index_groups=[[0, 1, 2, 3], [4, 5, 6, 7]],
            )[0]
        )
    with pytest.raises(VarioPathError, match="is not a multiple of the collective's size 2"):
        ones = jnp.ones(3, jnp.int32)
        run(
            lambda v: ragged_all_to_all(
                v,
                v,
                ones,
                ones,
                ones,
                ones,
                axis_name="x",
                axis_index_groups=[[0, 1], [2, 3], [4, 5], [6, 7]],
            )
        )
