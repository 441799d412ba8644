"""The NCCL transport where no GPU is (issue 16, "Several processes"): the run-time loader's
errors, the plan side (ffi/nccl/p2p.h: every rank's sends and receives per step, derived from the
layout every rank computes) on several plans, both ops and every execution mode it runs, and
configure's choice and refusals. The communicators themselves need GPUs: the GPU check
(benchmarks/gpu_check.py ``nccl``) runs a one-rank one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from helpers import free_port

from variopath_jax import _native
from variopath_jax.errors import VarioPathError
from variopath_jax.jax_ops import configure, nccl, release
from variopath_jax.planner.reference import PlannerParams
from variopath_jax.planner.schedulers import chooser_for
from variopath_jax.schedulers import unprofiled_networks
from variopath_jax.topology import PathModel

LOAD = "from variopath_jax.jax_ops import nccl; print(nccl.load())"


def _load_with(library: str) -> subprocess.CompletedProcess:
    """``nccl.load()`` in a fresh process (the loader keeps the first library that loads)."""
    env = dict(os.environ, VARIOPATH_NCCL_LIBRARY=library, JAX_PLATFORMS="cpu")
    return subprocess.run(
        [sys.executable, "-c", LOAD], capture_output=True, text=True, timeout=120, env=env
    )


def test_a_missing_library_is_named(tmp_path) -> None:
    missing = tmp_path / "no-such-libnccl.so.2"
    done = _load_with(str(missing))
    assert done.returncode != 0
    assert "VarioPathError" in done.stderr
    assert f"cannot load NCCL from {missing}" in done.stderr
    assert "$VARIOPATH_NCCL_LIBRARY" in done.stderr


def test_a_library_without_nccl_symbols_is_named() -> None:
    """A real shared library that is not NCCL: the first missing symbol is named."""
    done = _load_with("libm.so.6")
    assert done.returncode != 0
    assert "NCCL at libm.so.6 is unusable: it has no symbol ncclGetVersion" in done.stderr
    assert "2.14.0 or newer" in done.stderr


def test_the_library_path_prefers_the_environment(monkeypatch) -> None:
    monkeypatch.setenv(nccl.ENV, "/opt/nccl/lib/libnccl.so.2")
    assert nccl.library_path() == "/opt/nccl/lib/libnccl.so.2"
    monkeypatch.delenv(nccl.ENV)
    path = (
        nccl.library_path()
    )  # the wheel's library where one is installed, else the default search
    assert path == "" or path.endswith("nvidia/nccl/lib/libnccl.so.2")


# `make test` installs the nvidia-nccl-cu13 wheel (--no-deps) into this folder, off the virtual
# environment's path (Makefile, gpu-wheels); the test puts it on PYTHONPATH in its subprocess.
NCCL_WHEEL = (
    Path(os.environ.get("VARIOPATH_GPU_WHEELS", Path(__file__).parents[1] / ".venv/gpu-wheels"))
    / "nccl"
)


def test_the_wheels_library_loads_and_makes_an_id() -> None:
    """The nvidia-nccl wheel (the cuda12/cuda13 extras; in CI the one `make test` installs): found
    where the wheel puts it, it loads through our loader (every symbol the transport needs
    resolves, else load() names the missing one) and makes a unique id, with no GPU needed."""
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    path = nccl.library_path()
    if not path and (NCCL_WHEEL / "nvidia" / "nccl" / "lib" / "libnccl.so.2").exists():
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(NCCL_WHEEL), env.get("PYTHONPATH")) if p
        )
        path = str(NCCL_WHEEL / "nvidia" / "nccl" / "lib" / "libnccl.so.2")
    if not path:
        pytest.skip(
            f"no nvidia-nccl wheel (here or in {NCCL_WHEEL}, where `make test` installs it) "
            "and no VARIOPATH_NCCL_LIBRARY"
        )
    code = (
        "from variopath_jax import _native; from variopath_jax.jax_ops import nccl; "
        "lib = nccl.load(); "
        "print(lib['version'], len(_native.nccl_unique_id(lib['path'])), lib['path'])"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, done.stderr
    version, id_bytes, loaded = done.stdout.split()
    assert tuple(int(v) for v in version.split(".")) >= (2, 14, 0)
    assert id_bytes == "128"
    assert loaded == path  # the wheel's library, found by library_path() in the subprocess


def test_info_reports_the_library() -> None:
    env = dict(os.environ, JAX_PLATFORMS="cpu", VARIOPATH_NCCL_LIBRARY="/nonexistent/libnccl.so.2")
    done = subprocess.run(
        [sys.executable, "-m", "variopath_jax.cli", "info", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)["nccl"]
    assert out["version"] is None and "/nonexistent/libnccl.so.2" in out["error"]
    assert ("nccl" in _native.build_info()["transports"]) == _native.build_info()["cuda"]


# ----- the plan side: sends and receives per step ----------------------------------------------


def _a2av_slices(counts: np.ndarray) -> list[list[list[int]]]:
    """all_to_all_v: rank i's rows grouped by destination, counts[i][j] to j."""
    out = []
    for row in counts:
        at, mine = 0, []
        for j, c in enumerate(row):
            mine.append([j, at, int(c), -1])
            at += int(c)
        out.append(mine)
    return out


def _ragged_slices(counts: np.ndarray, rng) -> tuple[list, list, list[int]]:
    """ragged_all_to_all with one slice per destination, the sender's rows shuffled in place and
    each receiver's rows placed in source order after a gap: slices, recv_sizes, output rows."""
    n = len(counts)
    gap = 3
    out_rows = [gap + int(counts[:, j].sum()) + 2 for j in range(n)]
    slices, recv = [], []
    for i in range(n):
        order = rng.permutation(n)
        starts = np.zeros(n, int)
        at = 0
        for j in order:
            starts[j] = at
            at += int(counts[i, j])
        mine = []
        for j in range(n):
            out_at = gap + int(counts[:i, j].sum())
            mine.append([j, int(starts[j]), int(counts[i, j]), out_at])
        slices.append(mine)
        recv.append([int(counts[s, i]) for s in range(n)])
    return slices, recv, out_rows


def _check_pieces(plan: dict, n: int) -> list[tuple]:
    """Every send has its receive in the same step, same size, in per-pair order; returns the
    matched pieces as (src, dst, src_offset, dst_offset, nbytes)."""
    steps = plan["steps"]
    assert len({len(s) for s in steps}) == 1, "every rank sees the same steps"
    matched = []
    for s in range(len(steps[0])):
        sends, recvs = defaultdict(list), defaultdict(list)
        for r in range(n):
            for peer, off, nbytes in steps[r][s]["sends"]:
                assert peer != r and nbytes > 0
                sends[(r, peer)].append((off, nbytes))
            for peer, off, nbytes in steps[r][s]["recvs"]:
                assert peer != r and nbytes > 0
                recvs[(peer, r)].append((off, nbytes))
        assert sends.keys() == recvs.keys(), f"step {s}: a send or a receive has no partner"
        for (src, dst), out in sends.items():
            ins = recvs[(src, dst)]
            assert [b for _, b in out] == [b for _, b in ins], f"step {s}: {src}->{dst} sizes"
            matched += [(src, dst, so, do, b) for (so, b), (do, _) in zip(out, ins, strict=True)]
    return matched


def _deliver(matched: list[tuple], inputs: list[bytes], outputs: list[bytearray]) -> None:
    for src, dst, so, do, b in matched:
        outputs[dst][do : do + b] = inputs[src][so : so + b]


@pytest.mark.parametrize("execution", ["planned", "signal", "barrier", "concurrent"])
@pytest.mark.parametrize("topology,n", [("fig1", 6), (None, 4)])
def test_all_to_all_v_pieces_match_and_reproduce_the_layout(execution, topology, n) -> None:
    config = configure(topology, devices=n, execution=execution)
    try:
        rng = np.random.default_rng(n)
        row_bytes = 12
        for trial in range(3):
            counts = rng.integers(0, 9, (n, n))
            if trial == 1:
                counts[:, 2] = 0  # a rank receiving nothing
                counts[1] = 0  # a rank sending nothing
            out_rows = [int(counts[:, j].sum()) + 1 for j in range(n)]
            in_rows = [int(r.sum()) for r in counts]
            plan = _native.nccl_p2p_plan(
                config.id, _a2av_slices(counts), [], in_rows, out_rows, row_bytes, False
            )
            matched = _check_pieces(plan, n)
            assert sorted(matched) == sorted(tuple(c) for c in plan["copies"])
            assert sum(m[4] for m in matched) == row_bytes * int(counts.sum() - np.trace(counts))
            if execution != "concurrent":
                assert len(plan["steps"][0]) >= 1
            # the pieces deliver every row to where all_to_all_v puts it (self rows stay local)
            inputs = [
                rng.integers(0, 256, r * row_bytes, dtype=np.uint8).tobytes() for r in in_rows
            ]
            outputs = [bytearray(r * row_bytes) for r in out_rows]
            _deliver(matched, inputs, outputs)
            for j in range(n):
                at = 0
                for i in range(n):
                    size = int(counts[i, j]) * row_bytes
                    start = int(counts[i, :j].sum()) * row_bytes
                    if i != j:
                        assert outputs[j][at : at + size] == inputs[i][start : start + size]
                    at += size
    finally:
        release(config)


def test_each_rank_plans_and_lays_out_only_its_own_pieces() -> None:
    """Issue 28: on the multi-host transport each rank plans for itself (lay_out_call's ``me``):
    the chosen paced plan is expanded for its own transfers alone, and its pieces per step are
    exactly those of the whole plan's layout, so the ranks' pieces still match; each rank's plan
    is cached for that rank."""
    n = 6
    config = configure("fig1", devices=n)
    try:
        rng = np.random.default_rng(0)
        smaller = 0
        for scale in (8, 4096, 4096, 1 << 16):
            counts = rng.integers(scale // 2, scale, (n, n))
            in_rows = [int(r.sum()) for r in counts]
            out_rows = [int(counts[:, j].sum()) for j in range(n)]
            args = (config.id, _a2av_slices(counts), [], in_rows, out_rows, 64, False)
            whole = _native.nccl_p2p_plan(*args)
            before = np.asarray(_native.plan_counts())
            local = _native.nccl_p2p_plan(*args, local=True)
            again = _native.nccl_p2p_plan(*args, local=True)
            planned, exact, _ = np.asarray(_native.plan_counts()) - before
            assert again == local and exact >= n and planned <= n
            assert local["steps"] == whole["steps"]
            assert sorted(local["copies"]) == sorted(whole["copies"])
            # a paced plan: each rank's layout holds its sends and receives, not every transfer
            smaller += max(local["transfers"]) < whole["transfers"][0]
        assert smaller >= 1
    finally:
        release(config)


@pytest.mark.parametrize("execution", ["signal", "barrier", "concurrent"])
def test_ragged_pieces_match_and_land_at_the_senders_offsets(execution) -> None:
    n = 6
    config = configure("fig1", execution=execution)
    try:
        rng = np.random.default_rng(7)
        row_bytes = 8
        counts = rng.integers(0, 7, (n, n))
        slices, recv, out_rows = _ragged_slices(counts, rng)
        in_rows = [int(r.sum()) for r in counts]
        plan = _native.nccl_p2p_plan(config.id, slices, recv, in_rows, out_rows, row_bytes, True)
        matched = _check_pieces(plan, n)
        assert sorted(matched) == sorted(tuple(c) for c in plan["copies"])
        inputs = [rng.integers(0, 256, r * row_bytes, dtype=np.uint8).tobytes() for r in in_rows]
        outputs = [bytearray(r * row_bytes) for r in out_rows]
        _deliver(matched, inputs, outputs)
        for i in range(n):
            for j, start, rows, out_at in slices[i]:
                if i != j and rows:
                    got = outputs[j][out_at * row_bytes : (out_at + rows) * row_bytes]
                    assert got == inputs[i][start * row_bytes : (start + rows) * row_bytes]
    finally:
        release(config)


def test_a_step_is_cut_before_a_transfer_waiting_for_its_own_step(monkeypatch) -> None:
    """NCCL keeps no per-transfer signals: a plan whose transfers wait for others of their own
    step (the C++ core's ``chained`` plan's root chains) runs as more groups than steps, each cut
    before such a transfer, so every transfer is issued after all it waits for."""
    from variopath_jax.jax_ops import config as op_config
    from variopath_jax.sim import PCIE

    n = 8
    chained = {}

    def planner(model, *_):
        chooser = chooser_for(model, PlannerParams(lambda_s=PCIE.barrier_s))

        def plan(demand):
            schedule = chooser.apply(_native.Decision("chained"), np.asarray(demand), (PCIE,))
            assert schedule.meta["plan"] == "chained"  # built, not the fallback
            chained["plan"] = op_config.op_plan(schedule)
            return chained["plan"]

        return plan

    monkeypatch.setattr(op_config, "_model_aware_planner", planner)
    config = configure("direct-8", execution="model-aware")  # root-complex pairs: chains
    try:
        counts = np.random.default_rng(2).integers(512, 1024, (n, n))
        in_rows = [int(r.sum()) for r in counts]
        out_rows = [int(counts[:, j].sum()) for j in range(n)]
        plan = _native.nccl_p2p_plan(
            config.id, _a2av_slices(counts), [], in_rows, out_rows, 64, False
        )
        matched = _check_pieces(plan, n)
        assert sorted(matched) == sorted(tuple(c) for c in plan["copies"])
        made = chained["plan"]
        groups, cut = 0, 0  # the rule: a group per step, cut before a transfer waiting in its group
        for s in range(len(made["step_ptr"]) - 1):
            groups, first = groups + 1, made["step_ptr"][s]
            for t in range(made["step_ptr"][s], made["step_ptr"][s + 1]):
                if any(
                    d >= first
                    for d in made["after"][made["after_ptr"][t] : made["after_ptr"][t + 1]]
                ):
                    groups, first, cut = groups + 1, t, cut + 1
        assert cut > 0 and len(plan["steps"][0]) == groups
    finally:
        release(config)


def test_a_receiver_expecting_other_sizes_is_named() -> None:
    n = 6
    config = configure("fig1")
    try:
        counts = np.full((n, n), 2)
        slices, recv, out_rows = _ragged_slices(counts, np.random.default_rng(0))
        recv[3][1] = 5
        with pytest.raises(ValueError, match=r"rank 1 sends 2 rows .* rank 3 expects recv_sizes"):
            _native.nccl_p2p_plan(config.id, slices, recv, [2 * n] * n, out_rows, 4, True)
    finally:
        release(config)


def test_an_unregistered_configuration_is_named() -> None:
    counts = np.ones((2, 2), int)
    with pytest.raises(ValueError, match="configuration 12345 is not registered"):
        _native.nccl_p2p_plan(12345, _a2av_slices(counts), [], [2, 2], [2, 2], 4, False)


# ----- configure ------------------------------------------------------------------------------


def test_configure_refuses_nccl_for_cpu_devices() -> None:
    with pytest.raises(
        VarioPathError,
        match="transport 'nccl' moves GPU devices' rows, but this process's devices are cpu",
    ):
        configure(devices=2, transport="nccl")


def test_configure_refuses_nccl_with_debug() -> None:
    with pytest.raises(VarioPathError, match=r"debug=True .* not nccl's"):
        configure(devices=2, transport="nccl", debug=True)


def test_configure_names_nccl_among_the_transports() -> None:
    with pytest.raises(VarioPathError, match="memcpy, emulated, shm, nccl"):
        configure(devices=2, transport="rdma")


HOSTS = """
import sys
import jax
jax.distributed.initialize(sys.argv[1], num_processes=2, process_id=int(sys.argv[2]),
                           initialization_timeout=60)
from variopath_jax.jax_ops import nccl
print("hosts", nccl.hosts(30.0), nccl.hosts(30.0) == nccl.hosts(30.0), flush=True)
"""


def test_every_process_learns_every_host() -> None:
    """The key-value round configure uses to pick nccl for GPU processes on several hosts."""
    import socket

    port = free_port()
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", HOSTS, f"127.0.0.1:{port}", str(i)],
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
    host = socket.gethostname()
    for p, out in zip(procs, outs, strict=True):
        assert p.returncode == 0, out
        assert f"hosts {[host, host]} True" in out, out


def test_the_ranks_agree_on_one_decision_or_all_run_the_safe_plan() -> None:
    """Issue 51: each process applies the decision it made ahead from the call site's previous
    demand, and the gathered rows carry its id; where every rank holds the same decision it is
    applied, and where one rank does not (its process missed the previous call), every rank runs
    the safe plan (staged), so the ranks' pieces still match."""
    n = 6
    config = configure("fig1", devices=n)
    try:
        counts = np.random.default_rng(4).integers(1 << 15, 1 << 16, (n, n))
        in_rows = [int(r.sum()) for r in counts]
        out_rows = [int(counts[:, j].sum()) for j in range(n)]
        args = (config.id, _a2av_slices(counts), [], in_rows, out_rows, 64, False)
        demand = counts * 64
        np.fill_diagonal(demand, 0)
        chooser = chooser_for(PathModel(config.topology), PlannerParams())
        decision, _ = chooser.decide(demand, unprofiled_networks(20e-6))
        assert decision.plan not in ("staged", "concurrent")
        safe = _native.nccl_p2p_plan(*args, local=True)
        held = _native.nccl_p2p_plan(*args, local=True, decision=decision)
        missed = [True] * (n - 1) + [False]
        one_missed = _native.nccl_p2p_plan(*args, local=True, decision=decision, holds=missed)
        assert held["steps"] != safe["steps"]  # the decision's plan, not the safe one
        assert one_missed == safe
        whole = _native.nccl_p2p_plan(*args, decision=decision)
        assert held["steps"] == whole["steps"]  # each rank's own pieces are the whole plan's
    finally:
        release(config)
