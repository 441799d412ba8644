"""The JAX op on 8 forced CPU host devices (conftest sets XLA_FLAGS before jax is imported):
results against a NumPy oracle, gradients, several call sites, repeated calls, the HLO, the
executed schedule, ragged_all_to_all's contract, vmap, and failures in subprocesses."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from variopath_jax.errors import VarioPathError
from variopath_jax.jax_ops import all_to_all_v, configure, last_schedule, ragged_all_to_all

N = 8
pytestmark = pytest.mark.skipif(jax.device_count() < N, reason="needs 8 host devices (XLA_FLAGS)")


@pytest.fixture(scope="module")
def mesh():
    return jax.make_mesh((N,), ("x",), axis_types=(jax.sharding.AxisType.Explicit,))


def shard(mesh, a):
    return jax.device_put(a, NamedSharding(mesh, P("x")))


def oracle(x: np.ndarray, counts: np.ndarray, cap: int) -> tuple[np.ndarray, np.ndarray]:
    """x: (N, R, ...) per-rank rows; counts[i, j] rows from i to j."""
    y = np.zeros((N, cap, *x.shape[2:]), dtype=x.dtype)
    for j in range(N):
        parts = [x[i, counts[i, :j].sum() : counts[i, :j].sum() + counts[i, j]] for i in range(N)]
        got = np.concatenate(parts)
        y[j, : len(got)] = got
    return y, counts.T.copy()


def run_a2av(mesh, x, counts, cap):
    rows = x.shape[1]

    def body(xb, cb):
        y, r = all_to_all_v(xb, cb[0], axis_name="x", out_capacity=cap)
        return y, r[None]

    f = jax.jit(
        jax.shard_map(body, mesh=mesh, in_specs=(P("x"), P("x")), out_specs=(P("x"), P("x")))
    )
    y, r = f(shard(mesh, x.reshape(N * rows, *x.shape[2:])), shard(mesh, counts.astype(np.int32)))
    return np.asarray(y).reshape(N, cap, *x.shape[2:]), np.asarray(r)


@pytest.mark.parametrize(
    "case",
    ["random", "zeros", "skewed", "empty-ranks", "nothing", "full"],
)
def test_all_to_all_v_matches_numpy(mesh, case) -> None:
    rng = np.random.default_rng(hash(case) % 2**32)
    rows = 24
    counts = rng.integers(0, 4, size=(N, N))
    if case == "zeros":
        counts[rng.random((N, N)) < 0.5] = 0
    elif case == "skewed":
        counts = np.zeros((N, N), dtype=int)
        counts[:, 3] = 3  # everybody sends to rank 3
        counts[5] = [2, 2, 2, 2, 2, 2, 2, 2]
    elif case == "empty-ranks":
        counts[2] = 0
        counts[:, 6] = 0
    elif case == "nothing":
        counts[:] = 0
    elif case == "full":
        counts = np.full((N, N), 3)  # every output exactly full
    cap = int(max(counts.sum(axis=0).max(), 1)) if case == "full" else rows
    x = rng.standard_normal((N, rows, 3)).astype(np.float32)
    y, r = run_a2av(mesh, x, counts, cap)
    want_y, want_r = oracle(x, counts, cap)
    np.testing.assert_array_equal(y, want_y)
    np.testing.assert_array_equal(r, want_r)


@pytest.mark.parametrize(
    "dtype", [np.float32, jnp.bfloat16, np.int8, np.int32, np.complex64, np.bool_, np.uint16]
)
def test_dtypes_and_trailing_shapes(mesh, dtype) -> None:
    rng = np.random.default_rng(1)
    rows = 12
    counts = rng.integers(0, 2, size=(N, N))
    x = (rng.standard_normal((N, rows, 2, 3)) * 10).astype(dtype)
    y, _r = run_a2av(mesh, x, counts, rows)
    want_y, _ = oracle(np.asarray(x), counts, rows)
    assert np.asarray(y).dtype == np.asarray(x).dtype
    np.testing.assert_array_equal(np.asarray(y), want_y)


def test_gradient_is_the_reverse_exchange(mesh) -> None:
    rng = np.random.default_rng(2)
    rows, cap = 16, 20
    counts = rng.integers(0, 3, size=(N, N))
    x = rng.standard_normal((N, rows, 2)).astype(np.float32)
    w = rng.standard_normal((N, cap, 2)).astype(np.float32)

    def loss(xf, cf, wf):
        def body(xb, cb, wb):
            y, _ = all_to_all_v(xb, cb[0], axis_name="x", out_capacity=cap)
            return jnp.sum(y * wb)[None]

        return jax.shard_map(body, mesh=mesh, in_specs=(P("x"),) * 3, out_specs=P("x"))(
            xf, cf, wf
        ).sum()

    g = jax.jit(jax.grad(loss))(
        shard(mesh, x.reshape(N * rows, 2)),
        shard(mesh, counts.astype(np.int32)),
        shard(mesh, w.reshape(N * cap, 2)),
    )
    g = np.asarray(g).reshape(N, rows, 2)
    # oracle transpose: dx[i, rows sent to j] = w[j, where they landed]
    want = np.zeros_like(x)
    for i in range(N):
        for j in range(N):
            src = counts[i, :j].sum()
            dst = counts[:i, j].sum()
            want[i, src : src + counts[i, j]] = w[j, dst : dst + counts[i, j]]
    np.testing.assert_allclose(g, want)


def test_two_call_sites_and_repeated_calls(mesh) -> None:
    rng = np.random.default_rng(3)
    rows = 10
    c1 = rng.integers(0, 2, size=(N, N))
    c2 = rng.integers(0, 2, size=(N, N))
    x = rng.standard_normal((N, rows, 4)).astype(np.float32)

    def body(xb, a, b):
        y1, _ = all_to_all_v(xb, a[0], axis_name="x")
        y2, _ = all_to_all_v(y1 * 2.0, b[0], axis_name="x")  # depends on the first exchange
        return y2

    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("x"),) * 3, out_specs=P("x")))
    args = (
        shard(mesh, x.reshape(N * rows, 4)),
        shard(mesh, c1.astype(np.int32)),
        shard(mesh, c2.astype(np.int32)),
    )
    y1, _ = oracle(x, c1, rows)
    want, _ = oracle(y1 * 2.0, c2, rows)
    for _ in range(3):  # repeated launches of the same executable
        np.testing.assert_allclose(np.asarray(f(*args)).reshape(N, rows, 4), want)
    hlo = f.lower(*args).compile().as_text()
    assert "all-gather" not in hlo and hlo.count("variopath_all_to_all_v") >= 2


def test_executed_schedule_is_the_planned_one(mesh) -> None:
    from variopath_jax.catalog import get_catalog
    from variopath_jax.planner import PlannerParams
    from variopath_jax.planner.native import NativePlanner
    from variopath_jax.topology import PathModel

    cfg = configure("r5080-bf3", execution="signal", debug=True)
    try:
        rng = np.random.default_rng(4)
        rows = 32
        counts = rng.integers(0, 5, size=(N, N))
        x = rng.standard_normal((N, rows, 8)).astype(np.float32)
        y, _ = run_a2av(mesh, x, counts, rows)
        np.testing.assert_array_equal(y, oracle(x, counts, rows)[0])
        log = last_schedule()
        demand = counts * 8 * 4
        np.fill_diagonal(demand, 0)
        assert np.array_equal(log["demand"].reshape(N, N), demand)
        model = PathModel(cfg.topology)
        planned = NativePlanner(get_catalog(cfg.topology), model, PlannerParams()).plan(demand)
        steps = [(t.src, t.dst, t.nbytes) for st in planned.steps for t in st.transfers]
        executed = list(
            zip(log["src"].tolist(), log["dst"].tolist(), log["bytes"].tolist(), strict=True)
        )
        assert executed == steps and len(log["step_ptr"]) - 1 == len(planned.steps)
    finally:
        configure(devices=N)  # back to the default for the other tests


def test_ragged_all_to_all_docstring_example() -> None:
    mesh2 = jax.make_mesh(
        (2,), ("y",), axis_types=(jax.sharding.AxisType.Explicit,), devices=jax.devices()[:2]
    )
    configure(devices=2)
    try:
        operand = np.array([[1, 2, 2], [3, 4, 0]], dtype=np.float32)
        output = np.zeros((2, 4), dtype=np.float32)
        in_off = np.array([[0, 1], [0, 1]], dtype=np.int32)
        send = np.array([[1, 2], [1, 1]], dtype=np.int32)
        out_off = np.array([[0, 0], [1, 2]], dtype=np.int32)
        recv = np.array([[1, 1], [2, 1]], dtype=np.int32)

        def body(o, out, a, b, c, d):
            return ragged_all_to_all(o[0], out[0], a[0], b[0], c[0], d[0], axis_name="y")[None]

        f = jax.jit(jax.shard_map(body, mesh=mesh2, in_specs=(P("y"),) * 6, out_specs=P("y")))
        put = lambda a: jax.device_put(a, NamedSharding(mesh2, P("y")))  # noqa: E731
        got = np.asarray(f(*(put(a) for a in (operand, output, in_off, send, out_off, recv))))
        np.testing.assert_array_equal(got, [[1, 3, 0, 0], [2, 2, 4, 0]])
    finally:
        configure(devices=N)


def ragged_oracle(operand, output, in_off, send, out_off, recv, spd):
    result = output.copy()
    for i in range(N):
        for s in range(N * spd):
            j = s // spd
            rows = operand[i, in_off[i, s] : in_off[i, s] + send[i, s]]
            result[j, out_off[i, s] : out_off[i, s] + len(rows)] = rows
    return result


def test_ragged_all_to_all_random_and_gradient(mesh) -> None:
    rng = np.random.default_rng(5)
    spd, rows, cap = 2, 40, 64
    send = rng.integers(0, 3, size=(N, N * spd))
    in_off = np.zeros_like(send)
    out_off = np.zeros_like(send)
    for i in range(N):
        in_off[i] = np.concatenate([[0], np.cumsum(send[i])[:-1]])
    recv = np.zeros_like(send)
    for j in range(N):  # receiver j lays out the slices it gets in source order, with a gap of 1
        pos = 1
        for i in range(N):
            for t in range(spd):
                s = j * spd + t
                out_off[i, s] = pos
                recv[j, i * spd + t] = send[i, s]
                pos += send[i, s] + 1
    operand = rng.standard_normal((N, rows, 2)).astype(np.float32)
    output = rng.standard_normal((N, cap, 2)).astype(np.float32)
    want = ragged_oracle(operand, output, in_off, send, out_off, recv, spd)

    def run(o, out, a, b, c, d):
        def body(o, out, a, b, c, d):
            return ragged_all_to_all(o, out, a[0], b[0], c[0], d[0], axis_name="x")

        return jax.shard_map(body, mesh=mesh, in_specs=(P("x"),) * 6, out_specs=P("x"))(
            o, out, a, b, c, d
        )

    args = [shard(mesh, operand.reshape(N * rows, 2)), shard(mesh, output.reshape(N * cap, 2))]
    args += [shard(mesh, a.astype(np.int32)) for a in (in_off, send, out_off, recv)]
    got = np.asarray(jax.jit(run)(*args)).reshape(N, cap, 2)
    np.testing.assert_array_equal(got, want)
    w = rng.standard_normal((N * cap, 2)).astype(np.float32)
    d_operand, d_output = jax.jit(
        jax.grad(lambda o, out: (run(o, out, *args[2:]) * w).sum(), argnums=(0, 1))
    )(*args[:2])
    # oracle gradients: d_output is w where nothing was received; d_operand maps received cotangents back
    wr = w.reshape(N, cap, 2)
    want_out = wr.copy()
    want_op = np.zeros_like(operand)
    for i in range(N):
        for s in range(N * spd):
            j, n_rows = s // spd, send[i, s]
            want_out[j, out_off[i, s] : out_off[i, s] + n_rows] = 0
            want_op[i, in_off[i, s] : in_off[i, s] + n_rows] = wr[
                j, out_off[i, s] : out_off[i, s] + n_rows
            ]
    np.testing.assert_allclose(np.asarray(d_output).reshape(N, cap, 2), want_out)
    np.testing.assert_allclose(np.asarray(d_operand).reshape(N, rows, 2), want_op)


def test_vmap_runs_each_batch_element(mesh) -> None:
    rng = np.random.default_rng(6)
    rows, batch = 10, 3
    counts = rng.integers(0, 2, size=(N, N))
    x = rng.standard_normal((batch, N, rows)).astype(np.float32)

    def body(xb, cb):  # xb: (batch, rows)
        y, _ = jax.vmap(lambda v: all_to_all_v(v, cb[0], axis_name="x"))(xb)
        return y

    f = jax.jit(
        jax.shard_map(body, mesh=mesh, in_specs=(P(None, "x"), P("x")), out_specs=P(None, "x"))
    )
    got = np.asarray(
        f(
            jax.device_put(x.reshape(batch, N * rows), NamedSharding(mesh, P(None, "x"))),
            shard(mesh, counts.astype(np.int32)),
        )
    ).reshape(batch, N, rows)
    for b in range(batch):
        np.testing.assert_array_equal(got[b], oracle(x[b][..., None], counts, rows)[0][..., 0])


def test_trace_time_errors(mesh) -> None:
    with pytest.raises(VarioPathError, match="send_counts must be an integer array of shape"):
        jax.jit(
            jax.shard_map(
                lambda x: all_to_all_v(x, jnp.zeros(3, jnp.int32), axis_name="x")[0],
                mesh=mesh,
                in_specs=P("x"),
                out_specs=P("x"),
            )
        )(shard(mesh, np.zeros((N * 2,), np.float32)))
    configure("fig1")  # 6 ranks on an 8-device axis
    try:
        with pytest.raises(VarioPathError, match="has 8 devices but the configured topology"):
            jax.jit(
                jax.shard_map(
                    lambda x: all_to_all_v(x, jnp.zeros(N, jnp.int32), axis_name="x")[0],
                    mesh=mesh,
                    in_specs=P("x"),
                    out_specs=P("x"),
                )
            )(shard(mesh, np.zeros((N * 2,), np.float32)))
    finally:
        configure(devices=N)


FAILURE_SCRIPT = """
import os, sys, time
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
import numpy as np, jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
from variopath_jax.jax_ops import all_to_all_v, configure
configure(devices=8, timeout_s=3.0)
mesh = jax.make_mesh((8,), ("x",), axis_types=(jax.sharding.AxisType.Explicit,))
put = lambda a: jax.device_put(a, NamedSharding(mesh, P("x")))
counts = np.ones((8, 8), np.int32)
case = sys.argv[1]
def body(x, c):
    if case == "missing":
        # rank 5 skips the exchange: the others must time out, not hang
        y = jax.lax.cond(jax.lax.axis_index("x") == 5, lambda: x * 0,
                         lambda: all_to_all_v(x, c[0], axis_name="x")[0])
        return y
    return all_to_all_v(x, c[0], axis_name="x", out_capacity=4 if case == "capacity" else None)[0]
if case == "negative":
    counts[3, 2] = -1
if case == "too-many":
    counts[1] = 2
f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("x"), P("x")), out_specs=P("x")))
start = time.time()
try:
    f(put(np.zeros((64,), np.float32)), put(counts)).block_until_ready()
    print("NO ERROR")
except Exception as err:
    print("ERROR", type(err).__name__, str(err).splitlines()[0][:300], round(time.time() - start, 1))
# the process stays usable
g = jax.jit(jax.shard_map(lambda x, c: all_to_all_v(x, c[0], axis_name="x")[0], mesh=mesh,
            in_specs=(P("x"), P("x")), out_specs=P("x")))
ok = g(put(np.arange(64, dtype=np.float32)), put(np.ones((8, 8), np.int32)))
print("USABLE", float(np.asarray(ok).sum()))
"""


@pytest.mark.parametrize(
    "case, message",
    [
        ("negative", "send_counts[2] = -1 is negative"),
        ("too-many", "send_counts sum to 16 rows but x has 8"),
        ("capacity", "receives 8 rows but its output holds 4"),
        ("missing", "timed out after 3"),
    ],
)
def test_failures_are_errors_not_hangs(case: str, message: str, tmp_path) -> None:
    script = tmp_path / "fail.py"
    script.write_text(textwrap.dedent(FAILURE_SCRIPT))
    proc = subprocess.run(
        [sys.executable, str(script), case], capture_output=True, text=True, timeout=180
    )
    out = proc.stdout
    assert "ERROR" in out and message in out, (out, proc.stderr[-2000:])
    assert "USABLE 2016.0" in out
