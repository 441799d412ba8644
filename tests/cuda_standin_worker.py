"""The op's real CUDA host code on the CPU stand-in for CUDA (issue 52 item 6): a process that
loads the test module ``_native_cuda_standin`` (CMakeLists.txt, VARIOPATH_CUDA_STANDIN) as
``variopath_jax._native``, so that the whole package (configure, its planner, its transports)
runs on it, and calls the CUDA FFI handlers (ffi/ffi_cuda.cc) the way XLA's GPU client would:
one host thread per device, each with its device's stream, run id and buffers in the stand-in's
device memory (ffi/standin/bindings.cc). Results are checked against NumPy here.

``python cuda_standin_worker.py MODULE CASE [PROCESS PROCESSES PORT]``; prints one JSON line
per outcome (``{"case": ..., ...}``), the last ``{"done": true}``.

Cases: ``one-process`` (eight devices of one process: both ops, ``_into``, several executions
and plans, every allocation kind XLA may hand the handlers, with and without peer access),
``wedged`` (a device whose stream never runs again, before and after the counts' copy: the
calls fail at the deadline and the process stays usable), ``processes`` (one rank per process
over the transport configure picks from the stand-in's peer access: cuda-ipc where every pair
has it, cuda-host where not; PROCESS, PROCESSES, PORT for jax.distributed, env
``STANDIN_PEERS=all|none``, ``STANDIN_TRANSPORT`` to force one, ``STANDIN_READONLY=0`` for a
driver that refuses read-only registration).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time

MODULE, CASE = sys.argv[1], sys.argv[2]
_spec = importlib.util.spec_from_file_location("variopath_jax._native", MODULE)
standin = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(standin)
sys.modules["variopath_jax._native"] = standin  # before the package imports its _native

import numpy as np  # noqa: E402

U8, S32 = 6, 4  # XLA_FFI_DataType
N = 8


def say(**out) -> None:
    print(json.dumps(out), flush=True)


# ----- oracles and calls ------------------------------------------------------------------------


def a2av_oracle(x: list[np.ndarray], counts: np.ndarray, cap: int) -> list[np.ndarray]:
    """x[i]: rank i's rows (rows, row_bytes) grouped by destination; counts[i, j] rows i -> j."""
    n = len(x)
    out = []
    for j in range(n):
        got = [x[i][counts[i, :j].sum() : counts[i, :j].sum() + counts[i, j]] for i in range(n)]
        y = np.zeros((cap, x[0].shape[1]), np.uint8)
        rows = np.concatenate(got) if got else y[:0]
        y[: len(rows)] = rows
        out.append(y)
    return out


def a2av_calls(x, counts, cap, ranks, devices, into: bool) -> list[dict]:
    n = len(x)
    calls = []
    for r, d in zip(ranks, devices, strict=True):
        rb = x[r].shape[1]
        args = [
            (U8, list(x[r].shape), x[r].tobytes()),
            (S32, [n], counts[r].astype(np.int32).tobytes()),
            (S32, [], np.int32(r).tobytes()),
            (S32, [], np.int32(0).tobytes()),
        ]
        y = (U8, [cap, rb], None, 4) if into else (U8, [cap, rb], None)
        if into:
            args.append((U8, [cap, rb], np.full((cap, rb), 7, np.uint8).tobytes()))
        calls.append({"rank": r, "device": d, "args": args, "rets": [y, (S32, [n], None)]})
    return calls


def check_a2av(results, x, counts, cap) -> list[str]:
    want = a2av_oracle(x, counts, cap)
    wrong = []
    for res in results:
        r = res["rank"]
        if res["error"]:
            wrong.append(f"rank {r}: {res['error']}")
            continue
        y = np.frombuffer(res["rets"][0], np.uint8).reshape(cap, -1)
        got_counts = np.frombuffer(res["rets"][1], np.int32)
        if not np.array_equal(y, want[r]):
            wrong.append(f"rank {r}: {int((y != want[r]).sum())} wrong bytes")
        if not np.array_equal(got_counts, counts[:, r]):
            wrong.append(f"rank {r}: recv_counts {got_counts.tolist()} != {counts[:, r].tolist()}")
    return wrong


def ragged_case(rng, n: int, rb: int, per: int = 2, least: int = 0):
    """`per` slices from each rank to each (slice s goes to rank s // per), each placed at its
    receiver at 4·(i·per + e) + 1 (the e-th slice from rank i; gaps stay untouched): several
    slices to one rank make a transfer of several pieces (the batched copy kernel)."""
    k = n * per
    send = rng.integers(least, 4, size=(n, k))
    in_off = np.concatenate([np.zeros((n, 1), int), np.cumsum(send, axis=1)[:, :-1]], axis=1)
    out_off = np.zeros((n, k), int)
    recv = np.zeros((n, k), int)
    for i in range(n):
        for s in range(k):
            j, e = divmod(s, per)
            out_off[i, s] = 4 * (i * per + e) + 1
            recv[j, i * per + e] = send[i, s]
    cap, rows = 4 * k + 1, int(send.sum(axis=1).max()) + 1
    operand = [rng.integers(0, 256, size=(rows, rb), dtype=np.uint8) for _ in range(n)]
    output = [np.full((cap, rb), 200 + i, np.uint8) for i in range(n)]
    want = [o.copy() for o in output]
    for i in range(n):
        for s in range(k):
            j, at, m = s // per, int(out_off[i, s]), int(send[i, s])
            want[j][at : at + m] = operand[i][in_off[i, s] : in_off[i, s] + m]
    return (in_off, send, out_off, recv), operand, output, want  # the op's operand order


def ragged_calls(ints, operand, output, ranks, devices) -> list[dict]:
    k = ints[0].shape[1]
    calls = []
    for r, d in zip(ranks, devices, strict=True):
        arrays = [(S32, [k], a[r].astype(np.int32).tobytes()) for a in ints]
        args = [
            (U8, list(operand[r].shape), operand[r].tobytes()),
            (U8, list(output[r].shape), output[r].tobytes()),
            *arrays,
            (S32, [], np.int32(r).tobytes()),
            (S32, [], np.int32(0).tobytes()),
        ]
        rets = [(U8, list(output[r].shape), None, 1), (S32, [k], None), (S32, [k], None)]
        calls.append({"rank": r, "device": d, "args": args, "rets": rets})
    return calls


def check_ragged(results, want) -> list[str]:
    wrong = []
    for res in results:
        r = res["rank"]
        if res["error"]:
            wrong.append(f"rank {r}: {res['error']}")
            continue
        got = np.frombuffer(res["rets"][0], np.uint8).reshape(want[r].shape)
        if not np.array_equal(got, want[r]):
            wrong.append(f"rank {r}: {int((got != want[r]).sum())} wrong bytes")
    return wrong


_runs = iter(range(1, 1 << 30))


def exchange(
    cfg,
    kind=0,
    granted=(),
    into=False,
    most=3,
    rb=12,
    seed=0,
    busy_s=0.002,
    n=N,
    free=True,
    least=0,
    drain_s=30.0,
):
    """One all_to_all_v on every device of this process (n of them, `least` to `most` rows of
    `rb` bytes from each to each), checked; the list of what was wrong. `free`: release its
    buffers after; `drain_s`: how long to wait for each device's stream after the calls."""
    rng = np.random.default_rng(seed)
    counts = rng.integers(least, most + 1, size=(n, n))
    rows = int(counts.sum(axis=1).max())
    x = [rng.integers(0, 256, size=(rows, rb), dtype=np.uint8) for _ in range(n)]
    cap = int(counts.sum(axis=0).max()) + 2
    calls = a2av_calls(x, counts, cap, list(range(n)), list(range(n)), into)
    target = "variopath_all_to_all_v_into" if into else "variopath_all_to_all_v"
    res = standin.standin_call(
        target,
        cfg.id,
        1000 + seed,
        next(_runs),
        n,
        calls,
        kind,
        list(granted),
        drain_s,
        busy_s,
        seed,
        free,
    )
    return check_a2av(res, x, counts, cap)


def log_lines() -> list[str]:
    return list(standin.cuda_transport_log())


# ----- cases --------------------------------------------------------------------------------------


def decisions(wrote: int) -> dict[str, int]:
    """The peer-write decisions of the last call, which wrote into `wrote` new buffers of peers
    (cuda_streams.cc logs each once per address and writer), counted by their ending."""
    out: dict[str, int] = {}
    for line in log_lines()[-wrote:]:
        out[line.rsplit(": ", 1)[-1]] = out.get(line.rsplit(": ", 1)[-1], 0) + 1
    return out


def case_one_process() -> None:
    from variopath_jax.jax_ops import configure, last_schedule

    standin.standin_configure(devices=16, seed=1, max_delay_s=0.0003)
    cfg = configure("r5080-bf3", timeout_s=30)
    say(case="transport", transport=cfg.transport)
    # both ops, the _into variant, plain cudaMalloc memory, every pair with peer access
    for seed in range(3):
        say(case=f"a2av-{seed}", wrong=exchange(cfg, seed=seed))
    say(case="a2av-into", wrong=exchange(cfg, into=True, seed=7))
    rng = np.random.default_rng(5)
    ints, operand, output, want = ragged_case(rng, N, 6)
    res = standin.standin_call(
        "variopath_ragged_all_to_all",
        cfg.id,
        77,
        next(_runs),
        N,
        ragged_calls(ints, operand, output, range(N), range(N)),
        0,
        [],
        30.0,
        0.002,
        5,
    )
    say(case="ragged", wrong=check_ragged(res, want))
    # the executions: barrier, signal, concurrent
    for execution in ("barrier", "signal", "concurrent"):
        c = configure("r5080-bf3", execution=execution, timeout_s=30)
        say(case=f"execution-{execution}", wrong=exchange(c, seed=11))
    # a paced plan (rot-paced on 16 GPUs of l20-cx7, about 20 MiB per rank, where it pays for
    # its call path): paced_copy, the clock stamps and holds, each transfer's bytes no faster than
    # its cap; the site's second call, which applies the decision made from its first
    paced = configure("l20-cx7", timeout_s=60, debug=True)
    wrong = [w for _ in range(2) for w in exchange(paced, seed=3, most=512, rb=4096, n=16)]
    s = last_schedule(1003)
    say(case="paced", wrong=wrong, plan=s["plan"], pace=float(max(s["pace_gbs"])))
    # XLA's memory kinds: plain, pools and VMM mappings that grant the peers or not, under
    # ragged_all_to_all with two slices to each rank (transfers of two pieces: where a kernel may
    # store into the receiver's buffer, the batched copy kernel does; a transfer of one piece
    # always goes by cudaMemcpyPeerAsync). Buffers kept, so each call's 56 peer-write decisions
    # are of new addresses.
    everyone = list(range(N))
    for name, kind, granted in (
        ("plain", 0, []),
        ("pool-granted", 1, everyone),
        ("pool-private", 1, []),
        ("vmm-granted", 2, everyone),
        ("vmm-private", 2, []),
    ):
        ints, operand, output, want = ragged_case(np.random.default_rng(21), N, 6, least=1)
        calls = ragged_calls(ints, operand, output, range(N), range(N))
        res = standin.standin_call(
            "variopath_ragged_all_to_all",
            cfg.id,
            78,
            next(_runs),
            N,
            calls,
            kind,
            granted,
            30.0,
            0.002,
            21,
            False,
        )
        say(case=name, wrong=check_ragged(res, want), decisions=decisions(N * (N - 1)))
    say(case="faults", faults=list(standin.standin_faults()))
    say(case="counters", counters=dict(standin.standin_counters()))


def case_no_peers() -> None:
    from variopath_jax.jax_ops import configure

    none = [[False] * N for _ in range(N)]
    standin.standin_configure(devices=N, peer=none, seed=2, max_delay_s=0.0003)
    cfg = configure("r5080-bf3", timeout_s=30)
    wrong = exchange(cfg, seed=3, free=False, least=1)
    say(case="a2av", wrong=wrong, decisions=decisions(N * (N - 1)))
    say(case="a2av-into", wrong=exchange(cfg, into=True, seed=4))
    say(case="faults", faults=list(standin.standin_faults()))
    say(case="counters", counters=dict(standin.standin_counters()))


def case_wedged() -> None:
    from variopath_jax.jax_ops import configure

    standin.standin_configure(devices=N, seed=3)
    cfg = configure("r5080-bf3", timeout_s=2)
    say(case="healthy", wrong=exchange(cfg, seed=1, busy_s=0))
    # device 3's stream never runs again: its counts never reach the host
    standin.standin_wedge(3, 0)
    t = time.monotonic()
    wrong = exchange(cfg, seed=2, busy_s=0, drain_s=1.0)
    say(case="wedged-before-counts", wrong=wrong, seconds=time.monotonic() - t)
    standin.standin_configure(devices=N, seed=4)
    standin.standin_wedge(-1, 0)


def case_wedged_after() -> None:
    """The stream of device 5 stops after the call's first operations (the counts' copy and
    its event: the producer's 3 ops, the copy's 3 and their record): the call itself returns
    (stream-ordered: no host wait at its end), and what follows it on that stream never runs, as
    XLA's next operation would see."""
    from variopath_jax.jax_ops import configure

    standin.standin_configure(devices=N, seed=5)
    cfg = configure("r5080-bf3", timeout_s=2)
    say(case="healthy", wrong=exchange(cfg, seed=1, busy_s=0))
    standin.standin_wedge(5, 8)
    t = time.monotonic()
    wrong = exchange(cfg, seed=2, busy_s=0, drain_s=1.0)
    say(case="wedged-after-counts", wrong=wrong, seconds=time.monotonic() - t)


def case_processes() -> None:
    import jax

    me, count, port = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    peers = os.environ.get("STANDIN_PEERS", "all")
    matrix = [[peers == "all" or a == b for b in range(N)] for a in range(N)]
    standin.standin_configure(
        devices=N,
        peer=matrix,
        seed=10 + me,
        max_delay_s=0.0003,
        readonly_register=os.environ.get("STANDIN_READONLY", "1") == "1",
    )
    jax.distributed.initialize(
        f"127.0.0.1:{port}", num_processes=count, process_id=me, initialization_timeout=60
    )
    from variopath_jax.jax_ops import config, configure, release
    from variopath_jax.jax_ops import peers as peers_mod

    # this process's devices are GPUs (the stand-in's), device `me`
    config._local_platform = lambda: "gpu"
    peers_mod.local_ordinals = lambda: [me]
    cfg = configure(
        devices=count, transport=os.environ.get("STANDIN_TRANSPORT") or None, timeout_s=30
    )
    say(case="transport", transport=cfg.transport, reason=cfg.transport_reason)
    n = count
    for seed in range(3):
        rng = np.random.default_rng(seed)
        counts = rng.integers(0, 5, size=(n, n))
        x = [rng.integers(0, 256, size=(20, 10), dtype=np.uint8) for _ in range(n)]
        cap = int(counts.sum(axis=0).max()) + 1
        res = standin.standin_call(
            "variopath_all_to_all_v",
            cfg.id,
            500,
            seed,
            n,
            a2av_calls(x, counts, cap, [me], [me], False),
            0,
            [],
            30.0,
            0.002,
            seed,
        )
        say(case=f"a2av-{seed}", wrong=check_a2av(res, x, counts, cap))
    rng = np.random.default_rng(9)
    ints, operand, output, want = ragged_case(rng, n, 6)
    res = standin.standin_call(
        "variopath_ragged_all_to_all",
        cfg.id,
        501,
        0,
        n,
        ragged_calls(ints, operand, output, [me], [me]),
        0,
        [],
        30.0,
        0.002,
        9,
    )
    say(case="ragged", wrong=check_ragged(res, want))
    say(case="log", log=log_lines())
    say(case="faults", faults=list(standin.standin_faults()))
    say(case="counters", counters=dict(standin.standin_counters()))
    release(cfg)
    standin.shm_release_all()


CASES = {
    "one-process": case_one_process,
    "no-peers": case_no_peers,
    "wedged": case_wedged,
    "wedged-after": case_wedged_after,
    "processes": case_processes,
}

if __name__ == "__main__":
    try:
        CASES[CASE]()
        say(done=True)
    except BaseException:
        import traceback

        traceback.print_exc()
        sys.stderr.flush()
        standin.standin_unlink_segments()
        os._exit(1)
    sys.stdout.flush()
    standin.standin_unlink_segments()
    os._exit(0)  # jax.distributed's shutdown barrier and the stand-in's threads: not waited for
