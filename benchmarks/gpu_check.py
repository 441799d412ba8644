"""The prepared GPU check (issue 16; ``make gpu-check``): one verdict line per check.

Checks, in order (each prints ``CHECK <name>: PASS|FAIL|SKIP <detail>``):

- ``info``: the build has the CUDA transport and sees a device;
- ``jit``: both ops inside ``jit`` on one device against NumPy, several dtypes, a rank that sends
  nothing and an output filled exactly to capacity;
- ``small-call``: the host overhead of one small call (µs), beside a jitted copy of the same array;
- ``pack``: the batched copy kernel (the pack/unpack step) beside a device-to-device copy of the
  same bytes; the goal is >= 80%;
- ``threads``: threads acting as 8 ranks on one GPU, each with its own stream, random delays on
  the host and on the streams, every execution mode: a missing wait shows as wrong bytes;
- ``cuda-ipc``: the CUDA IPC transport (not built yet: SKIP);
- ``nccl``: a one-rank NCCL communicator through our loader on GPU 0 (init, an all-gather and a
  self send/receive checked byte for byte, destroy), then the ``jit`` cases on one GPU over the
  NCCL transport; SKIP with the reason where there is no GPU or no libnccl;
- ``two-processes``: whether two JAX processes under ``jax.distributed`` can share one GPU (a fact
  for the multi-process GPU tests to come; our op is not run).

``--platform cpu`` runs the checks that do not need CUDA on CPU devices (CI runs it that way, so
the script itself stays correct where no GPU is lent). Run: ``python benchmarks/gpu_check.py
[--platform gpu|cpu] [--quick]``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable

import numpy as np

RESULTS: list[tuple[str, str]] = []


def verdict(name: str, status: str, detail: str) -> None:
    RESULTS.append((name, status))
    print(f"CHECK {name}: {status} {detail}", flush=True)


def check(name: str, fn: Callable[[], tuple[str, str]]) -> None:
    """Run one check; an exception is its failure, never the script's."""
    start = time.perf_counter()
    try:
        status, detail = fn()
    except Exception as err:  # a verdict line for every check, whatever broke
        status, detail = "FAIL", f"{type(err).__name__}: {err}"
    verdict(name, status, f"{detail} ({time.perf_counter() - start:.1f} s)")


def check_info(platform: str) -> tuple[str, str]:
    import jax

    from variopath_jax._native import build_info, cuda_devices

    info, cuda = build_info(), cuda_devices()
    devices = jax.devices(platform)
    detail = f"transports {info['transports']}, jax {jax.__version__}, {len(devices)} {platform} device(s)"
    if platform == "gpu" and ("cuda" not in info["transports"] or cuda["device_count"] < 1):
        return "FAIL", f"{detail}; CUDA: {cuda}"
    return "PASS", detail


def _mesh(platform: str):
    import jax

    return jax.make_mesh(
        (1,),
        ("x",),
        devices=jax.devices(platform)[:1],
        axis_types=(jax.sharding.AxisType.Explicit,),
    )


def _on(mesh, *arrays):
    """The arrays placed on the one-device mesh, split along "x"."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    return [jax.device_put(a, NamedSharding(mesh, P("x"))) for a in arrays]


def check_jit(platform: str, transport: str | None = None) -> tuple[str, str]:
    """On one device the exchange is the rank's own rows: what it keeps, where, and the zeros."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    from variopath_jax.jax_ops import all_to_all_v, configure, ragged_all_to_all

    configure(devices=1, transport=transport)
    mesh = _mesh(platform)
    a2av = jax.jit(
        jax.shard_map(
            lambda x, c: all_to_all_v(x, c, axis_name="x"),
            mesh=mesh,
            in_specs=(P("x"), P("x")),
            out_specs=(P("x"), P("x")),
        )
    )
    ragged = jax.jit(
        jax.shard_map(
            lambda x, out, io, ss, oo, rs: ragged_all_to_all(x, out, io, ss, oo, rs, axis_name="x"),
            mesh=mesh,
            in_specs=(P("x"),) * 6,
            out_specs=P("x"),
        )
    )
    rng = np.random.default_rng(0)
    cases = 0
    for dtype in (np.float32, jnp.bfloat16, np.int8, np.int32):
        for rows, send in ((16, 9), (16, 0), (16, 16)):  # some rows, none, exactly full
            x = rng.integers(-100, 100, (rows, 3)).astype(dtype)
            y, recv = a2av(*_on(mesh, x, np.array([send], np.int32)))
            want = np.zeros_like(x)
            want[:send] = x[:send]
            if not (np.array_equal(np.asarray(y), want) and int(np.asarray(recv)[0]) == send):
                return "FAIL", f"all_to_all_v {np.dtype(dtype).name} rows={rows} send={send}"
            out = np.full((rows, 3), 7, dtype)
            at = rows - send
            ints = (np.array([v], np.int32) for v in (rows - send, send, at, send))
            got = ragged(*_on(mesh, x, out, *ints))
            want = out.copy()
            want[at : at + send] = x[rows - send :]
            if not np.array_equal(np.asarray(got), want):
                return "FAIL", f"ragged_all_to_all {np.dtype(dtype).name} rows={rows} send={send}"
            cases += 2
    return "PASS", f"{cases} cases against NumPy"


def check_nccl() -> tuple[str, str]:
    """A one-rank communicator through our loader (ffi/nccl/loader.h), then the op over it."""
    from variopath_jax._native import nccl_selftest
    from variopath_jax.jax_ops import configure, current_config, nccl, release

    library = nccl.library_info()
    if library["error"]:
        return "SKIP", library["error"]
    done = nccl_selftest(0, library["path"], 1 << 20, 60.0)
    if done["error"]:
        return "FAIL", f"{done['detail']}: {done['error']}"
    status, detail = check_jit("gpu", "nccl")
    release(current_config(1))
    configure(devices=1)  # the other checks' configuration again
    return status, f"{done['detail']}; jit over the nccl transport: {detail}"


def check_small_call(platform: str) -> tuple[str, str]:
    import jax
    from jax.sharding import PartitionSpec as P

    from variopath_jax.jax_ops import all_to_all_v, configure

    configure(devices=1)
    mesh = _mesh(platform)
    op = jax.jit(
        jax.shard_map(
            lambda x, c: all_to_all_v(x, c, axis_name="x")[0],
            mesh=mesh,
            in_specs=(P("x"), P("x")),
            out_specs=P("x"),
        )
    )
    copy = jax.jit(lambda x: x + 0)
    x, counts = _on(mesh, np.ones((64, 32), np.float32), np.array([64], np.int32))
    contenders = {"op": lambda: op(x, counts), "copy": lambda: copy(x)}
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for fn in contenders.values():  # compile and warm up
        fn().block_until_ready()
    for _ in range(200):  # interleaved
        for name, fn in contenders.items():
            start = time.perf_counter()
            fn().block_until_ready()
            times[name].append(time.perf_counter() - start)
    op_us, copy_us = (float(np.median(times[k])) * 1e6 for k in ("op", "copy"))
    return (
        "PASS",
        f"8 KiB all_to_all_v {op_us:.0f} µs per call, jitted copy {copy_us:.0f} µs (medians of 200)",
    )


def check_pack(quick: bool) -> tuple[str, str]:
    from variopath_jax import _native

    nbytes = (64 if quick else 256) << 20
    lines, worst = [], 1.0
    for segments in (1, 8, 32):
        r = _native.cuda_copy_bandwidth(0, nbytes, segments, 20)
        if r["error"]:
            return "FAIL", r["error"]
        ratio = r["batched_gbs"] / r["memcpy_gbs"]
        worst = min(worst, ratio)
        lines.append(
            f"{segments} seg {r['batched_gbs']:.0f} GB/s vs memcpy {r['memcpy_gbs']:.0f} ({ratio:.0%})"
        )
    return ("PASS" if worst >= 0.8 else "FAIL"), f"{nbytes >> 20} MiB: " + "; ".join(lines)


def check_threads(quick: bool) -> tuple[str, str]:
    from variopath_jax import _native
    from variopath_jax.jax_ops import configure, release

    n, rng, total, runs = 8, np.random.default_rng(1), 0, 0
    for execution in ("signal", "barrier", "concurrent"):
        config = configure(devices=n, execution=execution)
        for seed in range(2 if quick else 6):
            counts = rng.integers(0, 40, (n, n)).astype(np.int32)
            counts[rng.integers(0, n)] = 0  # a rank that sends nothing
            r = _native.cuda_exchange_on_one_gpu(
                config.id, 1000 + seed, counts.tolist(), 64, 0, seed, 2e-3, 5
            )
            errors = [e for e in r["errors"] if e]
            if errors or r["wrong_bytes"]:
                return (
                    "FAIL",
                    f"{execution} seed {seed}: {r['wrong_bytes']} wrong bytes; {errors[:2]}",
                )
            total += r["rounds"]
            runs += 1
        release(config)
    return "PASS", f"{runs} runs, {total} rounds, 3 execution modes, 8 ranks, no wrong byte"


TWO_PROCESSES = textwrap.dedent(
    """
    import os, sys
    import jax
    jax.distributed.initialize(sys.argv[1], num_processes=2, process_id=int(sys.argv[2]),
                               initialization_timeout=60)
    print("devices", len(jax.devices()), "local", len(jax.local_devices()), flush=True)
    """
)


def check_two_processes() -> tuple[str, str]:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, XLA_PYTHON_CLIENT_MEM_FRACTION="0.2", CUDA_VISIBLE_DEVICES="0")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", TWO_PROCESSES, f"127.0.0.1:{port}", str(i)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        for i in range(2)
    ]
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=120)[0])
        except subprocess.TimeoutExpired:
            p.kill()
            outs.append(p.communicate()[0] + " [timed out]")
    said = [next((ln for ln in o.splitlines() if ln.startswith("devices")), o[-200:]) for o in outs]
    ok = all(p.returncode == 0 for p in procs)
    return ("PASS" if ok else "FAIL"), "; ".join(s.strip() for s in said)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--platform", choices=("gpu", "cpu"), default="gpu")
    parser.add_argument("--quick", action="store_true", help="fewer seeds and smaller copies")
    args = parser.parse_args(argv)
    if args.platform == "cpu":
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
    from variopath_jax._native import build_info

    cuda = args.platform == "gpu" and "cuda" in build_info()["transports"]
    check("info", lambda: check_info(args.platform))
    check("jit", lambda: check_jit(args.platform))
    check("small-call", lambda: check_small_call(args.platform))
    for name, fn in (
        ("pack", lambda: check_pack(args.quick)),
        ("threads", lambda: check_threads(args.quick)),
    ):
        if cuda:
            check(name, fn)
        else:
            verdict(name, "SKIP", "needs a GPU and the CUDA transport")
    verdict("cuda-ipc", "SKIP", "the CUDA IPC transport is not built yet")
    if cuda:
        check("nccl", check_nccl)
    else:
        verdict("nccl", "SKIP", "needs a GPU and the CUDA transport")
    if args.platform == "gpu":
        check("two-processes", check_two_processes)
    failed = [name for name, status in RESULTS if status == "FAIL"]
    print(f"GPU CHECK: {'FAIL ' + ', '.join(failed) if failed else 'PASS'}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
