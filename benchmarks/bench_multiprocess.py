"""The shared-memory transport across JAX processes on one host, beside an in-process memcpy.

Starts PROCESSES processes (jax.distributed with a local coordinator) of DEVICES CPU devices
each; every rank sends the same number of bytes to every rank with ``all_to_all_v``. Process 0
times, round after round, one call of the op (all processes take part) and a memcpy of all the
bytes the call moves (the same measure as bench_jax_op.py) into a reused buffer and into fresh
memory, so that load on this machine hits them alike. Printed per payload per rank: the medians
with their interquartile spread and the ratio. It runs twice, one run after the other: receivers
reading the rows straight out of the senders' buffers (cross-memory attach, ffi/cma.h, where the
machine allows it) and reading them from the senders' staging (``VARIOPATH_SHM_CMA=0``).

Goal (issue 16): at >= 16 MiB per rank, at least 50% of the in-process memcpy's rate. Run:
``python benchmarks/bench_multiprocess.py [--processes 2] [--devices 1] [--rounds 9]
[--sizes-mib 4,16,64] [--execution signal] [--copy both|cma|staging] [--json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time

ROW = 128  # bytes per row (32 float32)


def worker(args) -> None:
    import jax
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    jax.distributed.initialize(
        f"127.0.0.1:{args.port}", num_processes=args.processes, process_id=args.process
    )
    from variopath_jax import _native
    from variopath_jax.jax_ops import all_to_all_v, configure, release

    n = jax.device_count()
    cfg = configure(devices=n, execution=args.execution, timeout_s=120.0)
    staged_because = _native.shm_staged_because(cfg.id)
    mesh = jax.make_mesh((n,), ("x",), axis_types=(jax.sharding.AxisType.Explicit,))

    def put(a):
        return jax.make_array_from_callback(a.shape, NamedSharding(mesh, P("x")), lambda i: a[i])

    f = jax.jit(
        jax.shard_map(
            lambda xb, cb: all_to_all_v(xb, cb[0], axis_name="x")[0],
            mesh=mesh,
            in_specs=(P("x"), P("x")),
            out_specs=P("x"),
        )
    )
    out = []
    for mib in (int(s) for s in args.sizes_mib.split(",")):
        rows = (mib << 20) // ROW  # per rank
        x = put(np.ones((n * rows, ROW // 4), np.float32))
        counts = put(np.full((n, n), rows // n, np.int32))
        moved = n * (rows // n) * n * ROW
        src = np.ones(moved // 4, np.float32)
        dst = np.empty_like(src)
        fns = {
            "shm": lambda x=x, c=counts: f(x, c).block_until_ready(),
            "memcpy": lambda d=dst, s=src: np.copyto(d, s),
            "cold_memcpy": lambda s=src: np.copyto(np.empty_like(s), s),
        }
        times = {k: [] for k in fns}
        for r in range(3 + args.rounds):  # 3 warm-up rounds
            for name, fn in fns.items():
                if name != "shm" and args.process != 0:
                    continue  # the memcpy is process 0's alone; the others wait in the next call
                start = time.perf_counter()
                fn()
                if r >= 3:
                    times[name].append(time.perf_counter() - start)
        if args.process == 0:
            med = {k: float(np.median(t)) for k, t in times.items()}
            iqr = {k: [float(q) for q in np.percentile(t, [25, 75])] for k, t in times.items()}
            out.append(
                {
                    "bytes_per_rank": mib << 20,
                    "median_s": med,
                    "iqr_s": iqr,
                    "shm_gbs": moved / med["shm"] / 1e9,
                    "memcpy_gbs": moved / med["memcpy"] / 1e9,
                    "of_memcpy": med["memcpy"] / med["shm"],
                    "of_cold_memcpy": med["cold_memcpy"] / med["shm"],
                }
            )
    release(cfg)
    if args.process == 0:
        print("RESULT " + json.dumps({"staged_because": staged_because, "rows": out}), flush=True)


def launch(args, cross_memory: bool) -> dict:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {
        **os.environ,
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={args.devices}",
        "JAX_PLATFORMS": "cpu",
        "VARIOPATH_SHM_CMA": "1" if cross_memory else "0",
    }
    common = ["--processes", str(args.processes), "--rounds", str(args.rounds)]
    common += ["--sizes-mib", args.sizes_mib, "--execution", args.execution, "--port", str(port)]
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--worker", str(p), *common],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for p in range(args.processes)
    ]
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=args.timeout_s)[0])
    except subprocess.TimeoutExpired as err:
        for proc in procs:
            proc.kill()
        raise SystemExit(
            f"the benchmark processes did not finish within {args.timeout_s:g} s"
        ) from err
    if any(proc.returncode for proc in procs):
        raise SystemExit(f"a benchmark process failed: exit codes {[p.returncode for p in procs]}")
    line = next(s for s in outputs[0].splitlines() if s.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--devices", type=int, default=1, help="CPU devices per process")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--sizes-mib", default="4,16,64", help="payloads per rank, MiB")
    parser.add_argument(
        "--execution", default="signal", choices=("signal", "barrier", "concurrent")
    )
    parser.add_argument(
        "--copy",
        default="both",
        choices=("both", "cma", "staging"),
        help="how receivers read the rows: cross-memory attach, staging, or one run of each",
    )
    parser.add_argument("--timeout-s", type=float, default=600.0)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--worker", type=int, default=None, dest="process", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.process is not None:
        worker(args)
        return
    runs = {
        copy: launch(args, cross_memory=copy == "cma")
        for copy in (("cma", "staging") if args.copy == "both" else (args.copy,))
    }
    if args.json:
        print(json.dumps(runs))
        return
    for run in runs.values():
        how = (
            "read out of the senders' buffers (cross-memory attach)"
            if not run["staged_because"]
            else f"read from the senders' staging ({run['staged_because']})"
        )
        print(
            f"{args.processes} processes x {args.devices} CPU devices, execution={args.execution}, "
            f"rows {how}; process 0's medians of {args.rounds} interleaved rounds [25th-75th "
            "percentile]"
        )
        report(run["rows"])


def report(out: list[dict]) -> None:
    print(
        f"{'per rank':>9}{'shm':>26}{'GB/s':>7}{'memcpy':>12}{'GB/s':>7}{'of memcpy':>11}{'of cold':>9}"
    )
    us = lambda s: f"{s * 1e6:.0f}"  # noqa: E731
    for r in out:
        m, q = r["median_s"], r["iqr_s"]
        shm = f"{us(m['shm'])}us [{us(q['shm'][0])}-{us(q['shm'][1])}]"
        print(
            f"{r['bytes_per_rank'] >> 20:>5} MiB{shm:>26}{r['shm_gbs']:>7.2f}{us(m['memcpy']):>10}us"
            f"{r['memcpy_gbs']:>7.2f}{r['of_memcpy']:>10.0%}{r['of_cold_memcpy']:>9.0%}"
        )
    big = [r for r in out if r["bytes_per_rank"] >= 16 << 20]
    if big:
        print(
            f">= 16 MiB per rank: {min(r['of_memcpy'] for r in big):.0%} of an in-process memcpy "
            f"at worst, {min(r['of_cold_memcpy'] for r in big):.0%} of one into fresh memory "
            "(goal >= 50%)"
        )


if __name__ == "__main__":
    main()
