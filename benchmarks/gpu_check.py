"""The prepared GPU check (issue 16; ``make gpu-check``): one verdict line per check.

Checks, in order (each prints ``CHECK <name>: PASS|FAIL|SKIP <detail>``):

- ``info``: the build has the CUDA transport and sees a device; which ``variopath_jax`` was
  imported (its path: the installed package, never the source tree, whose ``variopath_jax/`` has
  no built ``_native``);
- ``jit``: both ops inside ``jit`` on one device against NumPy, several dtypes, a rank that sends
  nothing and an output filled exactly to capacity;
- ``small-call``: the host overhead of one small call (µs), beside a jitted copy of the same array;
- ``pack``: the batched copy kernel (the pack/unpack step) beside a device-to-device copy of the
  same bytes; the goal is >= 80%;
- ``pack-rows``: the batched copy of whole rows of 2, 6, 12 and 14 bytes (segments that start and
  end off 16-byte boundaries, the source differently from the destination), every byte checked,
  beside the aligned segments of ``pack``; the goal is >= 50%;
- ``threads``: threads acting as 8 ranks on one GPU, each with its own stream, random delays on
  the host and on the streams, every execution mode: a missing wait shows as wrong bytes;
- ``two-processes``: whether two JAX processes under ``jax.distributed`` can share one GPU;
- ``cuda-ipc``: two processes (spawned) on GPU 0, one rank each, exchanging over the CUDA IPC
  transport (``cuda_process_exchange``: random busy streams before each call, staging that grows
  by generations), every byte checked;
- ``cuda-host``: the same over the host-staged transport (rows bounced through pinned shared
  host memory, issue 29), every byte checked, then a staging budget too small for a call, which
  must fail naming it;
- ``cuda-ipc-jax``, ``cuda-host-jax``: two JAX processes under ``jax.distributed`` on GPU 0
  running both ops through the cuda-ipc transport (configure's default there: one GPU needs no
  peer access) and through cuda-host, against NumPy (tests/multiprocess_worker.py); SKIP when
  JAX refuses two processes on one GPU;
- ``profile``: the profiler's CUDA backend (``variopath profile --backend cuda``) on GPU 0 alone:
  device-to-device copies standing in for a path class, staged copies through pinned host memory,
  k = 1, 2, 4 flows, paced and unpaced; PASS when it measures and fits (its numbers are printed,
  not judged: one GPU has no PCIe path between GPUs to profile);
- ``nccl``: a one-rank NCCL communicator through our loader on GPU 0 (init, an all-gather and a
  self send/receive checked byte for byte, destroy), then the ``jit`` cases on one GPU over the
  NCCL transport; SKIP with the reason where there is no GPU or no libnccl.

Every check runs in a process of its own with a timeout of its own (``--only NAME`` runs one in
this process), so a sticky CUDA error, a crash or a hang fails that check alone and names it; the
parent imports neither JAX nor CUDA. XLA's preallocation is off everywhere
(``XLA_PYTHON_CLIENT_PREALLOCATE=false``, set here before anything starts): several processes
share the GPU. After each check its process prints the CUDA transport's log (``NOTE`` lines: each
peer-write decision and every fallback, such as ``cudaHostRegisterReadOnly`` refused and a
peer's staging read from pageable memory), so that no fallback is silent.

Every process it starts runs with ``python -P`` (the current directory, the repository root, is
not put on ``sys.path``), so it imports the installed package as this one does, and says which.
``--platform cpu`` runs the checks that do not need CUDA on CPU devices (CI runs it that way, so
the script itself stays correct where no GPU is lent). Run: ``python benchmarks/gpu_check.py
[--platform gpu|cpu] [--quick] [--only NAME]``.
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

# before JAX is imported anywhere, here or in a child (which inherits it): several processes share
# one GPU, and XLA would otherwise take 75% of its memory in the first
os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"

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


def package_path() -> str:
    """Where the imported ``variopath_jax`` lies (a child process must import the same one)."""
    import variopath_jax

    return os.path.dirname(os.path.abspath(variopath_jax.__file__))


def python() -> list[str]:
    """The command line start of a child process: this interpreter with ``-P``, so that the
    current directory (the repository root, whose ``variopath_jax/`` has no built ``_native``)
    does not shadow the installed package."""
    return [sys.executable, "-P"]


def check_info(platform: str) -> tuple[str, str]:
    import jax

    from variopath_jax._native import build_info, cuda_devices

    info, cuda = build_info(), cuda_devices()
    devices = jax.devices(platform)
    detail = (
        f"variopath_jax from {package_path()}, transports {info['transports']}, "
        f"jax {jax.__version__}, {len(devices)} {platform} device(s), "
        f"XLA_PYTHON_CLIENT_PREALLOCATE={os.environ.get('XLA_PYTHON_CLIENT_PREALLOCATE')}"
    )
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


def check_pack_rows(quick: bool) -> tuple[str, str]:
    """Rows whose size is no multiple of 16: the copy must keep 16-byte stores (head/tail split,
    shifted loads where source and destination are misaligned differently)."""
    from variopath_jax import _native

    nbytes, segments = (64 if quick else 256) << 20, 32
    aligned = _native.cuda_copy_bandwidth(0, nbytes, segments, 20)
    if aligned["error"]:
        return "FAIL", f"aligned: {aligned['error']}"
    lines, worst = [f"aligned {aligned['batched_gbs']:.0f} GB/s"], 1.0
    for row in (2, 6, 12, 14):
        r = _native.cuda_copy_bandwidth(0, nbytes, segments, 20, row_bytes=row)
        if r["error"]:
            return "FAIL", f"rows of {row} B: {r['error']}"
        ratio = r["batched_gbs"] / aligned["batched_gbs"]
        worst = min(worst, ratio)
        lines.append(
            f"rows of {row} B: {r['nbytes']} bytes exact, {r['batched_gbs']:.0f} GB/s ({ratio:.0%})"
        )
    return ("PASS" if worst >= 0.5 else "FAIL"), f"{segments} seg: " + "; ".join(lines)


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
    freed = _native.cuda_release_scratch(60.0)  # the paced transfers' clock buffers, at teardown
    if freed:
        return "FAIL", f"releasing the scratch buffers: {freed}"
    return "PASS", f"{runs} runs, {total} rounds, 3 execution modes, 8 ranks, no wrong byte"


IPC_RANK = textwrap.dedent(
    """
    import json, os, sys, time
    from pathlib import Path
    import variopath_jax
    from variopath_jax import _native
    from variopath_jax.jax_ops import configure
    rank, where, rounds, transport = int(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    deadline = time.monotonic() + 60

    def wait_for(name):
        while not (where / name).exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"rank {rank} waited 60 s for {name}")
            time.sleep(0.01)
        return (where / name).read_text()

    def publish(name, text):
        (where / (name + ".tmp")).write_text(text)
        os.replace(where / (name + ".tmp"), where / name)

    def bootstrap(cfg, step):
        # its one-process transport goes: two are bootstrapped here by hand
        _native.shm_release(cfg.id)
        if rank == 0:
            publish(f"control{step}", _native.shm_create(cfg.id, 2, 30.0))
            wait_for(f"attached{step}")
        else:
            _native.shm_attach(cfg.id, wait_for(f"control{step}"), 1, 2)
            publish(f"attached{step}", "1")
        _native.shm_ready(cfg.id, False)  # no cross-memory attach: the rows are on the GPU

    cfg = configure(devices=2, transport=transport, timeout_s=30.0)
    bootstrap(cfg, 0)
    total, wrong, errors = 0, 0, []
    # row sizes that make the staging grow by generations, and shrink back
    for k, (row_bytes, most) in enumerate([(64, 40), (4096, 300), (64, 40), (65536, 64)]):
        counts = [[(7 * i + 13 * j + 5 * k) % most for j in range(2)] for i in range(2)]
        if k == 2:
            counts[1] = [0, 0]  # a rank that sends nothing
        r = _native.cuda_process_exchange(cfg.id, 50 + k, rank, counts, row_bytes, 0, k, 2e-3, rounds)
        total += r["rounds"]
        wrong += r["wrong_bytes"]
        if r["error"]:
            errors.append(f"rows of {row_bytes} B: {r['error']}")
    _native.shm_release(cfg.id)
    budget = ""
    if transport == "cuda-host":  # 64 KiB of staging cannot hold 1 MiB of rows
        cfg = configure(devices=2, transport=transport, timeout_s=30.0, staging_budget=1 << 16)
        bootstrap(cfg, 1)
        r = _native.cuda_process_exchange(cfg.id, 60, rank, [[0, 256], [256, 0]], 4096, 0, 0, 0.0, 1)
        budget = r["error"]
        if "staging budget of 65536 bytes" not in budget:
            errors.append(f"a call past the staging budget did not fail naming it: {budget!r}")
        _native.shm_release(cfg.id)
    package = os.path.dirname(os.path.abspath(variopath_jax.__file__))
    said = {"rank": rank, "rounds": total, "wrong_bytes": wrong, "errors": errors, "budget": budget,
            "package": package, "log": _native.cuda_transport_log()}
    print(json.dumps(said), flush=True)
    """
)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(
    commands: list[list[str]], env: dict[str, str], timeout_s: float
) -> list[tuple[int | None, str]]:
    """Run the commands at once; each one's exit code and output (stdout and stderr), every one
    killed past the timeout (code None)."""
    procs = [
        subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        for cmd in commands
    ]
    deadline, out = time.monotonic() + timeout_s, []
    for p in procs:
        try:
            text = p.communicate(timeout=max(1.0, deadline - time.monotonic()))[0]
            out.append((p.returncode, text))
        except subprocess.TimeoutExpired:
            p.kill()
            out.append((None, p.communicate()[0] + " [timed out]"))
    return out


def _gpu_env() -> dict[str, str]:
    """Two processes sharing GPU 0: XLA must not take most of its memory in each."""
    return dict(
        os.environ,
        CUDA_VISIBLE_DEVICES="0",
        XLA_PYTHON_CLIENT_PREALLOCATE="false",
        XLA_PYTHON_CLIENT_MEM_FRACTION="0.2",
    )


def check_process_exchange(quick: bool, transport: str) -> tuple[str, str]:
    """Two native ranks in two processes on GPU 0 over ``transport`` (cuda-ipc or cuda-host)."""
    import json
    import tempfile

    with tempfile.TemporaryDirectory() as where:
        rounds = "3" if quick else "10"
        commands = [
            [*python(), "-c", IPC_RANK, str(rank), where, rounds, transport] for rank in range(2)
        ]
        results = _run(commands, _gpu_env(), 180)
    said = [
        next((json.loads(ln) for ln in o.splitlines() if ln.startswith("{")), None)
        for _, o in results
    ]
    for rank, ((code, out), r) in enumerate(zip(results, said, strict=True)):
        if code != 0 or r is None:
            return "FAIL", f"rank {rank} exited with {code}: {out[-600:]}"
        if r["errors"] or r["wrong_bytes"]:
            return "FAIL", f"rank {rank}: {r['wrong_bytes']} wrong bytes; {r['errors'][:2]}"
        if r["package"] != package_path():
            return (
                "FAIL",
                f"rank {rank} imported variopath_jax from {r['package']}, not {package_path()}",
            )
    for rank, r in enumerate(
        said
    ):  # the fallbacks each rank took (e.g. pageable reads), never silent
        for line in dict.fromkeys(r.get("log", [])):
            print(f"NOTE {transport} rank {rank}: {line}", flush=True)
    budget = f"; past the budget: {said[0]['budget'][-120:]}" if said[0]["budget"] else ""
    return (
        "PASS",
        f"2 processes on GPU 0, {said[0]['rounds']} calls each, 4 row sizes, no wrong byte{budget}",
    )


def check_process_jax(quick: bool, transport: str) -> tuple[str, str]:
    import json
    from pathlib import Path

    worker = Path(__file__).resolve().parents[1] / "tests" / "multiprocess_worker.py"
    port = str(_free_port())
    executions = "signal" if quick else "signal,barrier,concurrent"
    commands = [[*python(), str(worker), "ops", str(p), "2", port] for p in range(2)]
    # cuda-ipc as configure's default (its probe: one GPU needs no peer access), cuda-host asked for
    asked = "" if transport == "cuda-ipc" else transport
    results = _run(commands, dict(_gpu_env(), EXECUTIONS=executions, TRANSPORT=asked), 240)
    lines = [[json.loads(ln) for ln in o.splitlines() if ln.startswith("{")] for _, o in results]
    up = [any(r.get("result") == "initialized" for r in got) for got in lines]
    if not all(up):  # jax.distributed did not come up with two processes on one GPU
        tail = (
            next(o for (_, o), ok in zip(results, up, strict=True) if not ok).strip().splitlines()
        )
        return (
            "SKIP",
            f"JAX refuses two processes on one GPU: {tail[-1] if tail else '(no output)'}",
        )
    for p, ((code, out), got) in enumerate(zip(results, lines, strict=True)):
        done = [r["execution"] for r in got if r.get("result") == "ok"]
        if code != 0 or done != executions.split(","):
            return "FAIL", f"process {p} (exit {code}): {got[-2:]} {out[-600:]}"
        chosen = {(r["transport"], r["reason"]) for r in got if r.get("result") == "copy"}
        if {t for t, _ in chosen} != {transport}:
            return "FAIL", f"process {p} ran over {chosen}, not {transport}"
    why = next(iter(chosen))[1]
    return (
        "PASS",
        f"both ops, {executions}, 3 calls each, 2 processes on GPU 0 over {transport} ({why}), "
        "against NumPy",
    )


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
    address = f"127.0.0.1:{_free_port()}"
    env = dict(os.environ, XLA_PYTHON_CLIENT_MEM_FRACTION="0.2", CUDA_VISIBLE_DEVICES="0")
    results = _run([[*python(), "-c", TWO_PROCESSES, address, str(i)] for i in range(2)], env, 120)
    outs = [o for _, o in results]
    said = [next((ln for ln in o.splitlines() if ln.startswith("devices")), o[-200:]) for o in outs]
    ok = all(code == 0 for code, _ in results)
    return ("PASS" if ok else "FAIL"), "; ".join(s.strip() for s in said)


def check_profile(quick: bool) -> tuple[str, str]:
    from variopath_jax.profile import CudaBackend, Plan, fit, measure

    backend = CudaBackend({"PIX": (0, 0), "SHM": (0, 0)})
    plan = Plan(flow_counts=(1, 2, 4), loads=(0.5, 1.25), nbytes=(64 if quick else 256) << 20)
    fitted = fit(measure(backend, plan))
    rates = ", ".join(f"{c} {g:.0f} GB/s" for c, g in fitted["rate_gbs"].items())
    classes = "; ".join(
        f"{c}: beta {p['beta']:.3f} floor {p['floor']:.2f} paced_lossless {p['paced_lossless']}"
        for c, p in fitted["classes"].items()
    )
    costs = ", ".join(f"{k} {v * 1e6:.2f} µs" for k, v in fitted["costs"].items())
    return "PASS", f"{rates}; {classes}; {costs}"


# Every check: its name, a function of the arguments, whether it needs CUDA, and its timeout (s)
# in a process of its own (a bound on a hang, not a prediction).
CHECKS: list[tuple[str, Callable[[argparse.Namespace], tuple[str, str]], bool, float]] = [
    ("info", lambda a: check_info(a.platform), False, 90),
    ("jit", lambda a: check_jit(a.platform), False, 180),
    ("small-call", lambda a: check_small_call(a.platform), False, 120),
    ("pack", lambda a: check_pack(a.quick), True, 120),
    ("pack-rows", lambda a: check_pack_rows(a.quick), True, 120),
    ("threads", lambda a: check_threads(a.quick), True, 180),
    ("two-processes", lambda a: check_two_processes(), True, 150),
    ("cuda-ipc", lambda a: check_process_exchange(a.quick, "cuda-ipc"), True, 200),
    ("cuda-ipc-jax", lambda a: check_process_jax(a.quick, "cuda-ipc"), True, 260),
    ("cuda-host", lambda a: check_process_exchange(a.quick, "cuda-host"), True, 200),
    ("cuda-host-jax", lambda a: check_process_jax(a.quick, "cuda-host"), True, 260),
    ("profile", lambda a: check_profile(a.quick), True, 180),
    ("nccl", lambda a: check_nccl(), True, 180),
]


def run_one(name: str, args: argparse.Namespace) -> int:
    """``--only NAME``: the check in this process, its verdict line, then the transport's log."""
    fn = next(fn for n, fn, _, _ in CHECKS if n == name)
    check(name, lambda: fn(args))
    from variopath_jax import _native

    if hasattr(_native, "cuda_transport_log"):
        for line in _native.cuda_transport_log():
            print(f"NOTE {name}: {line}", flush=True)
    return 0 if RESULTS[-1][1] != "FAIL" else 1


def run_isolated(name: str, args: argparse.Namespace, timeout_s: float) -> None:
    """One check in a child process: its lines passed on, a FAIL naming a crash or a hang."""
    cmd = [*python(), os.path.abspath(__file__), "--only", name, "--platform", args.platform]
    start = time.perf_counter()
    code, out = _run([cmd + (["--quick"] if args.quick else [])], dict(os.environ), timeout_s)[0]
    lines = out.splitlines()
    said = [ln for ln in lines if ln.startswith((f"CHECK {name}:", "NOTE "))]
    for ln in said:
        print(ln, flush=True)
    mine = [ln for ln in said if ln.startswith("CHECK ")]
    if mine:
        RESULTS.append((name, mine[-1].split(": ", 1)[1].split(" ", 1)[0]))
        return
    took = time.perf_counter() - start
    why = (
        f"timed out after {timeout_s:.0f} s" if code is None else f"its process exited with {code}"
    )
    tail = " | ".join(ln for ln in lines[-6:] if ln.strip())[-600:]
    verdict(name, "FAIL", f"{why}, no verdict ({took:.1f} s): {tail}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--platform", choices=("gpu", "cpu"), default="gpu")
    parser.add_argument("--quick", action="store_true", help="fewer seeds and smaller copies")
    parser.add_argument("--only", choices=[c[0] for c in CHECKS], help="run one check here")
    parser.add_argument("--skip", default="", help="checks not to run, comma-separated")
    args = parser.parse_args(argv)
    if args.platform == "cpu":
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
    if args.only:
        return run_one(args.only, args)
    from variopath_jax._native import build_info  # the native module only: no JAX, no CUDA context

    transports = build_info()["transports"]
    cuda = args.platform == "gpu" and "cuda" in transports
    skip = set(filter(None, args.skip.split(",")))
    for name, _, needs_cuda, timeout_s in CHECKS:
        transport = next((t for t in ("cuda-ipc", "cuda-host") if name.startswith(t)), None)
        if name in skip:
            verdict(name, "SKIP", "--skip")
        elif name == "two-processes" and args.platform != "gpu":
            verdict(name, "SKIP", "a GPU question")
        elif name.endswith("-jax") and ("two-processes", "FAIL") in RESULTS:
            verdict(name, "SKIP", "JAX refuses two processes on one GPU (two-processes)")
        elif needs_cuda and not (cuda and (transport is None or transport in transports)):
            verdict(name, "SKIP", f"needs a GPU and the {transport or 'CUDA'} transport")
        else:
            run_isolated(name, args, timeout_s)
    failed = [name for name, status in RESULTS if status == "FAIL"]
    print(f"GPU CHECK: {'FAIL ' + ', '.join(failed) if failed else 'PASS'}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
