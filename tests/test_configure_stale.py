"""Configuration that cannot go stale: a function jitted under one ``configure`` and called after
``configure`` changed it is traced again and runs the new configuration (jit's cache key holds
the current configuration); configuring the same thing again keeps the compiled code; an
executable compiled ahead of time keeps its own and fails once that is released."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from variopath_jax.jax_ops import all_to_all_v, configure, last_schedule, ops, release

N = 8
pytestmark = pytest.mark.skipif(jax.device_count() < N, reason="needs 8 host devices (XLA_FLAGS)")


def test_configure_again_reaches_functions_already_jitted() -> None:
    mesh = jax.make_mesh((N,), ("x",), axis_types=(jax.sharding.AxisType.Explicit,))
    put = lambda a: jax.device_put(a, NamedSharding(mesh, P("x")))  # noqa: E731
    traces = []

    def body(x, c):
        traces.append(1)
        return all_to_all_v(x, c[0], axis_name="x", out_capacity=16)[0]

    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("x"), P("x")), out_specs=P("x")))
    x = put(np.arange(N * 8, dtype=np.float32))
    counts = put(np.ones((N, N), np.int32))
    expect = np.arange(N * 8, dtype=np.float32).reshape(N, N).T  # row j: element j of each rank
    expect = np.concatenate([expect, np.zeros((N, 8), np.float32)], axis=1).reshape(-1)

    def steps(site: int | None = None) -> int:  # of the last call (of the site lowered last)
        return len(last_schedule(site)["step_ptr"]) - 1

    first = configure("r5080-bf3", execution="barrier", debug=True)
    try:
        np.testing.assert_array_equal(np.asarray(f(x, counts)), expect)
        assert len(traces) == 1 and steps() > 1  # the barrier plan: several activations
        barrier_site = ops.last_site  # a call site's id is derived from its configuration's
        configure("r5080-bf3", execution="barrier", debug=True)  # the same id: compiled code kept
        f(x, counts)
        assert len(traces) == 1
        second = configure("r5080-bf3", execution="concurrent", debug=True)
        release(first)  # a call still bound to the first would fail now
        np.testing.assert_array_equal(np.asarray(f(x, counts)), expect)
        assert len(traces) == 2 and steps() == 1  # traced again: every pair at once, one step
        # ahead-of-time: the executable keeps the configuration it was lowered with ...
        compiled = f.lower(x, counts).compile()
        configure("r5080-bf3", execution="barrier", debug=True)
        np.testing.assert_array_equal(np.asarray(compiled(x, counts)), expect)
        assert steps() == 1
        # ... until it is released: then it fails at once, naming it
        release(second)
        with pytest.raises(Exception, match=str(second.id)):
            np.asarray(compiled(x, counts))
        # the jitted function: back to the barrier configuration, compiled for it at first
        fewer = np.ones((N, N), np.int32)
        fewer[:, 0] = 0  # a new demand, so the log shows this call
        f(x, put(fewer)).block_until_ready()
        assert len(traces) == 2 and steps(barrier_site) > 1
        demand = last_schedule(barrier_site)["demand"].reshape(N, N)
        np.testing.assert_array_equal(demand, (fewer - np.eye(N, dtype=np.int32)).clip(0) * 4)
    finally:
        configure(devices=N)  # back to the default for the other tests
