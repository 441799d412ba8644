"""all_to_all_v throughput on 8 CPU devices, beside an in-process memcpy and jax.lax.all_to_all.

Each rank sends the same number of bytes to every rank (uniform counts, so jax.lax.all_to_all, the
nearest JAX peer on CPU, can run the same exchange). Printed per payload per rank: the wall time
of one call (median of repeats), bytes moved per second, the same for a single memcpy of all the
bytes moved (the limit on this machine) and for jax.lax.all_to_all, and the ratios.

Goals (issue 8): at >= 16 MiB per rank, at least 70% of the memcpy rate; at small sizes, per-call
overhead no worse than 3x jax.lax.all_to_all's. Run: ``python benchmarks/bench_jax_op.py [--json]``.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import argparse
import json
import time

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from variopath_jax.jax_ops import all_to_all_v

N = 8
ROW = 128  # bytes per row (32 float32): 1 KiB per rank is one row to each of the 8 ranks


def median_time(fn, repeats: int) -> float:
    fn()  # compile and warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def measure(mesh, rows: int, repeats: int) -> dict:
    put = lambda a: jax.device_put(a, NamedSharding(mesh, P("x")))  # noqa: E731
    per_peer = rows // N
    x = put(np.ones((N * rows, ROW // 4), np.float32))
    counts = put(np.full((N, N), per_peer, np.int32))
    vario = jax.jit(
        jax.shard_map(
            lambda xb, cb: all_to_all_v(xb, cb[0], axis_name="x")[0],
            mesh=mesh,
            in_specs=(P("x"), P("x")),
            out_specs=P("x"),
        )
    )
    lax_a2a = jax.jit(
        jax.shard_map(
            lambda xb: jax.lax.all_to_all(xb, "x", 0, 0, tiled=True),
            mesh=mesh,
            in_specs=P("x"),
            out_specs=P("x"),
        )
    )
    moved = N * rows * ROW  # bytes every rank sends, summed (self traffic included)
    src = np.ones(moved // 4, np.float32)
    dst = np.empty_like(src)
    t_vario = median_time(lambda: vario(x, counts).block_until_ready(), repeats)
    t_lax = median_time(lambda: lax_a2a(x).block_until_ready(), repeats)
    t_copy = median_time(lambda: np.copyto(dst, src), repeats)
    # into fresh memory, as XLA's outputs are: includes the kernel's page faults
    t_cold = median_time(lambda: np.copyto(np.empty_like(src), src), repeats)
    return {
        "bytes_per_rank": rows * ROW,
        "variopath_s": t_vario,
        "lax_all_to_all_s": t_lax,
        "memcpy_s": t_copy,
        "cold_memcpy_s": t_cold,
        "variopath_gbs": moved / t_vario / 1e9,
        "lax_gbs": moved / t_lax / 1e9,
        "memcpy_gbs": moved / t_copy / 1e9,
        "of_memcpy": t_copy / t_vario,
        "of_cold_memcpy": t_cold / t_vario,
        "vs_lax_time": t_vario / t_lax,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    mesh = jax.make_mesh((N,), ("x",), axis_types=(jax.sharding.AxisType.Explicit,))
    rows_list = [(1 << k) // ROW for k in range(10, 27, 2)]  # 1 KiB .. 64 MiB per rank
    out = [measure(mesh, rows, args.repeats) for rows in rows_list]
    if args.json:
        print(json.dumps(out))
        return
    print(
        f"{'per rank':>10}{'variopath':>12}{'GB/s':>7}{'lax a2a':>11}{'GB/s':>7}{'memcpy':>10}{'GB/s':>7}"
        f"{'of memcpy':>11}{'of cold':>9}{'time/lax':>10}"
    )
    for r in out:
        size = r["bytes_per_rank"]
        label = f"{size >> 20} MiB" if size >= 1 << 20 else f"{size >> 10} KiB"
        print(
            f"{label:>10}{r['variopath_s'] * 1e6:>10.0f}us{r['variopath_gbs']:>7.2f}"
            f"{r['lax_all_to_all_s'] * 1e6:>9.0f}us{r['lax_gbs']:>7.2f}{r['memcpy_s'] * 1e6:>8.0f}us"
            f"{r['memcpy_gbs']:>7.2f}{r['of_memcpy']:>10.0%}{r['of_cold_memcpy']:>9.0%}{r['vs_lax_time']:>10.2f}"
        )
    big = [r for r in out if r["bytes_per_rank"] >= 16 << 20]
    small = [r for r in out if r["bytes_per_rank"] <= 64 << 10]
    print(
        f">= 16 MiB per rank: {min(r['of_memcpy'] for r in big):.0%} of memcpy, "
        f"{min(r['of_cold_memcpy'] for r in big):.0%} of a memcpy into fresh memory at worst (goal >= 70%); "
        f"<= 64 KiB: {max(r['vs_lax_time'] for r in small):.2f}x jax.lax.all_to_all's time at worst (goal <= 3x)"
    )


if __name__ == "__main__":
    main()
