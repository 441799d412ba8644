"""all_to_all_v throughput on 8 CPU devices, beside an in-process memcpy and jax.lax.all_to_all.

Each rank sends the same number of bytes to every rank (uniform counts, so jax.lax.all_to_all, the
nearest JAX peer on CPU, can run the same exchange). After warm-up calls, the contenders (our op
with ``--execution``, by default ``planned``, the default; the op with ``signal`` and with
``concurrent``; the default op writing into a donated output buffer, ``out=``, reused call after
call (issue 30); jax.lax.all_to_all; a memcpy of all the bytes moved into a reused buffer, the
same into fresh memory) run interleaved, round after round, so that load on this shared machine
hits them alike (in a random order each round). Printed per payload per rank: the plan the op
ran, the median time of one call with its interquartile spread, bytes moved per second, and the
ratios. A payload whose op rate comes out above the warm memcpy's, the limit on this machine, is
reported as unreliable instead of as a figure.

Goals (issue 15): at >= 16 MiB per rank, at least 70% of the memcpy rate; at <= 64 KiB, at most
1.5x jax.lax.all_to_all's time. Issue 30: the same goals with a donated output (``donated``).
Issue 28: ``planned`` no slower than ``signal`` at <= 64 KiB and >= 16 MiB, and an unpaced plan
no slower than ``concurrent``. ``planned`` plans Algorithm 2 at the network model's barrier cost
(λ = 20 µs under ``pcie``) and ``signal`` at the planner's default (5 µs), which makes different
activations; ``/signal λ`` compares with ``signal`` planned at the model's λ too, the same plan
where ``planned`` runs ``signal``: what the execution itself costs. Run: ``python
benchmarks/bench_jax_op.py [--json] [--rounds 9] [--execution planned|signal|barrier|concurrent]``.
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

from variopath_jax.jax_ops import all_to_all_v, configure
from variopath_jax.jax_ops.config import OpConfig
from variopath_jax.planner import PlannerParams
from variopath_jax.schedulers import PlanRequest, get_scheduler
from variopath_jax.sim import PCIE
from variopath_jax.topology import PathModel

N = 8
ROW = 128  # bytes per row (32 float32): 1 KiB per rank is one row to each of the 8 ranks


def interleaved(fns: dict, rounds: int, warmup: int = 3) -> dict[str, np.ndarray]:
    """Times of ``rounds`` calls of each function, the functions taking turns each round in a
    seeded random order (in a fixed cyclic order the contender right after the memcpy into fresh
    memory ran up to 1.5x slower, whichever it was: seen with two identical ones)."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    rng = np.random.default_rng(0)
    times = {name: [] for name in fns}
    for _ in range(rounds):
        for name in rng.permutation(list(fns)):
            start = time.perf_counter()
            fns[name]()
            times[name].append(time.perf_counter() - start)
    return {name: np.array(t) for name, t in times.items()}


def planned_family(config: OpConfig, per_peer: int) -> str:
    """The family ``execution="planned"`` runs for this uniform exchange: the C++ choice, as the
    ``variopath`` scheduler makes it among the same families (tests/test_op_execution.py); "-"
    for the other executions."""
    if config.execution != "planned":
        return "-"
    demand = np.full((N, N), per_peer, np.int64)
    np.fill_diagonal(demand, 0)
    request = PlanRequest(demand, PathModel(config.topology), PCIE.barrier_s)
    return get_scheduler("variopath").plan(request).meta["plan"]


def measure(mesh, rows: int, rounds: int, configs: dict[str, OpConfig]) -> dict:
    put = lambda a: jax.device_put(a, NamedSharding(mesh, P("x")))  # noqa: E731
    per_peer = rows // N
    x = put(np.ones((N * rows, ROW // 4), np.float32))
    counts = put(np.full((N, N), per_peer, np.int32))

    def op(config: OpConfig):
        return jax.jit(
            jax.shard_map(
                lambda xb, cb: all_to_all_v(xb, cb[0], axis_name="x", config=config)[0],
                mesh=mesh,
                in_specs=(P("x"), P("x")),
                out_specs=P("x"),
            )
        )

    ops = {name: op(config) for name, config in configs.items()}
    into = jax.jit(
        jax.shard_map(
            lambda xb, cb, ob: all_to_all_v(
                xb, cb[0], axis_name="x", out=ob, config=configs["variopath"]
            )[0],
            mesh=mesh,
            in_specs=(P("x"), P("x"), P("x")),
            out_specs=P("x"),
        ),
        donate_argnums=2,
    )
    held = [put(np.zeros((N * rows, ROW // 4), np.float32))]  # the donated buffer, step to step

    def donated() -> None:
        held[0] = into(x, counts, held[0])
        held[0].block_until_ready()

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
    times = interleaved(
        {
            **{name: (lambda f=f: f(x, counts).block_until_ready()) for name, f in ops.items()},
            "donated": donated,
            "lax": lambda: lax_a2a(x).block_until_ready(),
            "memcpy": lambda: np.copyto(dst, src),
            # into fresh memory, as XLA's outputs are: includes the kernel's page faults
            "cold_memcpy": lambda: np.copyto(np.empty_like(src), src),
        },
        rounds,
    )
    med = {k: float(np.median(t)) for k, t in times.items()}
    spread = {k: [float(q) for q in np.percentile(t, [25, 75])] for k, t in times.items()}
    return {
        "bytes_per_rank": rows * ROW,
        "plan": planned_family(configs["variopath"], rows // N * ROW),
        "median_s": med,
        "iqr_s": spread,
        "variopath_gbs": moved / med["variopath"] / 1e9,
        "lax_gbs": moved / med["lax"] / 1e9,
        "memcpy_gbs": moved / med["memcpy"] / 1e9,
        "of_memcpy": med["memcpy"] / med["variopath"],
        "of_cold_memcpy": med["cold_memcpy"] / med["variopath"],
        "vs_lax_time": med["variopath"] / med["lax"],
        "donated_gbs": moved / med["donated"] / 1e9,
        "donated_of_memcpy": med["memcpy"] / med["donated"],
        "donated_vs_lax_time": med["donated"] / med["lax"],
        "vs_signal_time": med["variopath"] / med["signal"],
        "vs_signal_model_time": med["variopath"] / med["signal_model"],
        "vs_concurrent_time": med["variopath"] / med["concurrent"],
        "reliable": min(med["variopath"], med["donated"]) >= med["memcpy"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument(
        "--execution", default="planned", choices=("planned", "signal", "barrier", "concurrent")
    )
    args = parser.parse_args()
    configs = {
        "variopath": configure(devices=N, execution=args.execution),
        "signal": configure(devices=N, execution="signal"),
        "signal_model": configure(
            devices=N, execution="signal", params=PlannerParams(lambda_s=PCIE.barrier_s)
        ),
        "concurrent": configure(devices=N, execution="concurrent"),
    }
    mesh = jax.make_mesh((N,), ("x",), axis_types=(jax.sharding.AxisType.Explicit,))
    rows_list = [(1 << k) // ROW for k in range(10, 27, 2)]  # 1 KiB .. 64 MiB per rank
    out = [measure(mesh, rows, args.rounds, configs) for rows in rows_list]
    if args.json:
        print(json.dumps(out))
        return
    print(
        f"execution={args.execution}; medians of {args.rounds} interleaved rounds [25th-75th percentile]"
    )
    print(
        f"{'per rank':>9}{'plan':>11}{'variopath':>24}{'GB/s':>7}{'lax a2a':>22}{'memcpy':>10}"
        f"{'GB/s':>7}{'of memcpy':>11}{'of cold':>9}{'time/lax':>10}{'/signal':>9}{'/signal λ':>10}{'/concurrent':>12}"
        f"{'donated':>9}{'of memcpy':>11}{'time/lax':>10}"
    )
    us = lambda s: f"{s * 1e6:.0f}"  # noqa: E731
    for r in out:
        size = r["bytes_per_rank"]
        label = f"{size >> 20} MiB" if size >= 1 << 20 else f"{size >> 10} KiB"
        m, q = r["median_s"], r["iqr_s"]
        vario = f"{us(m['variopath'])}us [{us(q['variopath'][0])}-{us(q['variopath'][1])}]"
        lax = f"{us(m['lax'])}us [{us(q['lax'][0])}-{us(q['lax'][1])}]"
        if not r["reliable"]:
            print(
                f"{label:>9}  unreliable: faster than a memcpy of the same bytes; re-run on a quiet machine"
            )
            continue
        print(
            f"{label:>9}{r['plan']:>11}{vario:>24}{r['variopath_gbs']:>7.2f}{lax:>22}"
            f"{us(m['memcpy']):>8}us{r['memcpy_gbs']:>7.2f}{r['of_memcpy']:>10.0%}"
            f"{r['of_cold_memcpy']:>9.0%}{r['vs_lax_time']:>10.2f}{r['vs_signal_time']:>9.2f}"
            f"{r['vs_signal_model_time']:>10.2f}{r['vs_concurrent_time']:>12.2f}{us(m['donated']):>7}us{r['donated_of_memcpy']:>10.0%}"
            f"{r['donated_vs_lax_time']:>10.2f}"
        )
    big = [r for r in out if r["bytes_per_rank"] >= 16 << 20 and r["reliable"]]
    small = [r for r in out if r["bytes_per_rank"] <= 64 << 10 and r["reliable"]]
    if big and small:
        print(
            f">= 16 MiB per rank: {min(r['of_memcpy'] for r in big):.0%} of memcpy at worst, "
            f"{min(r['of_cold_memcpy'] for r in big):.0%} of a memcpy into fresh memory (goal >= 70% of memcpy); "
            f"<= 64 KiB: {max(r['vs_lax_time'] for r in small):.2f}x jax.lax.all_to_all's time at worst (goal <= 1.5x)"
        )
        print(
            f"donated output: >= 16 MiB per rank: {min(r['donated_of_memcpy'] for r in big):.0%} of "
            f"memcpy at worst (goal >= 70%); <= 64 KiB: "
            f"{max(r['donated_vs_lax_time'] for r in small):.2f}x jax.lax.all_to_all's time at "
            "worst (goal <= 1.5x)"
        )
        print(
            f"{args.execution} / signal time at worst: <= 64 KiB "
            f"{max(r['vs_signal_time'] for r in small):.2f}x, >= 16 MiB "
            f"{max(r['vs_signal_time'] for r in big):.2f}x (goal <= 1x); / signal at the model's λ: "
            f"{max(r['vs_signal_model_time'] for r in small):.2f}x, "
            f"{max(r['vs_signal_model_time'] for r in big):.2f}x; unpaced plans / "
            "concurrent at worst: "
            + (
                f"{max(r['vs_concurrent_time'] for r in out if r['plan'] != 'paced' and r['reliable']):.2f}x"
                if any(r["plan"] != "paced" and r["reliable"] for r in out)
                else "none ran"
            )
        )


if __name__ == "__main__":
    main()
