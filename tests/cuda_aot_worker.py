"""Compiles the op for eight H100s on a machine without a GPU (issue 52 item 4):
``python cuda_aot_worker.py TARGET_CONFIG``, with JAX's CUDA plugin (``jax-cuda13-plugin`` and
``jax-cuda13-pjrt`` of the installed jaxlib's version) importable, e.g. through PYTHONPATH.

XLA's CUDA plugin makes compile-only devices from a target description
(``jax.experimental.topologies.get_topology_desc(platform="cuda", target_config=...,
topology="1x1x8")``: one slice, one host, eight GPUs) and compiles for them with no GPU and no
driver: what a GPU process's jit would build, up to the point where it runs. Each program is
lowered and compiled once. Prints one JSON object: per program its lowered StableHLO's custom
calls, the compiled HLO's custom-call lines and its module header (where the donation alias
shows), and what compiling a call to a target nobody registered raised."""

from __future__ import annotations

import json
import sys
import time

import jax
import numpy as np
from jax.experimental import topologies
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from variopath_jax.jax_ops import all_to_all_v, ragged_all_to_all

N = 8


def main(target_config: str) -> dict:
    started = time.perf_counter()
    topo = topologies.get_topology_desc(
        platform="cuda", target_config=target_config, topology=f"1x1x{N}"
    )
    mesh = topologies.make_mesh(topo, (N,), ("x",))

    def sharded(shape, dtype):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, P("x")))

    rows = sharded((N * 16, 4), np.float32)
    ints = sharded((N, N), np.int32)

    def shard_map(f):
        return jax.shard_map(f, mesh=mesh, in_specs=P("x"), out_specs=P("x"))

    def a2av(x, c):
        return all_to_all_v(x, c[0], axis_name="x")[0]

    def a2av_into(x, c, out):
        return all_to_all_v(x, c[0], axis_name="x", out=out)[0]

    def ragged(x, out, in_off, send, out_off, recv):
        return ragged_all_to_all(x, out, in_off[0], send[0], out_off[0], recv[0], axis_name="x")

    def gradient(x, c):
        return jax.grad(lambda v: shard_map(a2av)(v * v, c).sum())(x)

    programs = {
        "all_to_all_v": (shard_map(a2av), (rows, ints), {}),
        "all_to_all_v_into": (shard_map(a2av_into), (rows, ints, rows), {"donate_argnums": 2}),
        "ragged_all_to_all": (
            shard_map(ragged),
            (rows, rows, ints, ints, ints, ints),
            {"donate_argnums": 1},
        ),
        "gradient": (gradient, (rows, ints), {}),
    }
    out = {"devices": [d.device_kind for d in topo.devices], "programs": {}}
    for name, (f, args, kw) in programs.items():
        t = time.perf_counter()
        lowered = jax.jit(f, **kw).trace(*args).lower()
        stablehlo = [ln.strip() for ln in lowered.as_text().splitlines() if "custom_call @" in ln]
        compiled = lowered.compile().as_text()
        lines = compiled.splitlines()
        out["programs"][name] = {
            "lowered_custom_calls": stablehlo,
            "header": next(ln for ln in lines if ln.startswith("HloModule")),
            "custom_calls": [ln.strip() for ln in lines if " custom-call(" in ln],
            "parameters": [ln.strip() for ln in lines if " parameter(" in ln],
            "seconds": round(time.perf_counter() - t, 2),
        }

    def bogus(x):
        return jax.ffi.ffi_call("variopath_no_such_target", jax.ShapeDtypeStruct(x.shape, x.dtype))(
            x
        )

    try:
        jax.jit(shard_map(bogus)).trace(rows).lower().compile()
        out["bogus"] = None
    except Exception as err:  # what XLA's compiler says, whatever its class
        out["bogus"] = f"{type(err).__name__}: {err}"
    out["seconds"] = round(time.perf_counter() - started, 2)
    return out


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        print(json.dumps(main(f.read())))
