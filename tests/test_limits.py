"""Every command refuses a size it cannot handle before building anything, naming the limit
(``variopath_jax.cli.limits.check_sizes``): a deployment of 100,000 nodes and an absurd byte
size, each command in turn, in one fresh interpreter whose builders all fail if reached."""

from __future__ import annotations

import json
import subprocess
import sys

from variopath_jax.cli import limits

NODES = ["--nodes", "100000"]
# each command with a deployment too large, then with an absurd size of its own kind
CASES = {
    "gap nodes": ["gap", "--topology", "r5080-bf3", *NODES, "--sizes", "8", "--seeds", "1"],
    "gap bytes": ["gap", "--topology", "r5080-bf3", "--sizes", "1e9", "--seeds", "1"],
    "topo show nodes": ["topo", "show", "r5080-bf3", *NODES],
    "topo show past its path model": ["topo", "show", "r5080-bf3", "--nodes", "3000"],
    "plan nodes": ["plan", "--topology", "r5080-bf3", *NODES, "--workload", "moe"],
    "plan bytes": ["plan", "--topology", "r5080-bf3", "--workload", "zipf",
                   "--bytes-per-rank", "1PB"],
    "run nodes": ["run", "--topology", "l20-cx7", *NODES, "--scheduler", "nccl",
                  "--workload", "zipf"],
    "run bytes": ["run", "--topology", "l20-cx7", "--scheduler", "nccl", "--workload", "zipf",
                  "--bytes-per-rank", "1e15"],
    "run bytes per pair": ["run", "--topology", "l20-cx7", "--scheduler", "nccl",
                           "--workload", "uniform", "--bytes-per-pair", "100GB"],
    "run tokens": ["run", "--topology", "l20-cx7", "--scheduler", "nccl", "--workload", "moe",
                   "--tokens", "1000000"],
    "bench seeds": ["bench", "fig7", "--quick", "--seeds", "1000000000"],
    "simulate nodes": ["simulate", "--topology", "r5080-bf3", *NODES, "--schedule", "s.json"],
    "profile bytes": ["profile", "--nbytes", "1PiB"],
    "profile repeats": ["profile", "--repeats", "1000000000"],
    "catalog nodes": ["catalog", "build", "r5080-bf3", *NODES],
    "demo tokens": ["demo", "--tokens", "100000000"],
}  # fmt: skip

# what each case's message must name: the option and the limit
EXPECT = {
    "gap nodes": ["--nodes 100,000", f"{limits.MAX_GAP_RANKS} ranks"],
    "gap bytes": ["--sizes 1e9", "1,048,576 MiB a rank"],
    "topo show nodes": ["--nodes 100,000", f"{limits.MAX_TOPOLOGY_RANKS:,} ranks"],
    "topo show past its path model": ["24,000 ranks", "--nodes 2048 here"],
    "plan nodes": ["--nodes 100,000", "1,024 ranks"],
    "plan bytes": ["--bytes-per-rank 1,000,000,000,000,000", "(1 TiB) a rank"],
    "run nodes": ["--nodes 100,000", "1,024 ranks"],
    "run bytes": ["--bytes-per-rank 1,000,000,000,000,000", "(1 TiB) a rank"],
    "run bytes per pair": ["--bytes-per-pair 100,000,000,000", "to its 15 peer(s)", "(1 TiB)"],
    "run tokens": ["--tokens 1,000,000", "routing keys", f"{limits.MAX_MOE_DRAWS:,} draws"],
    "bench seeds": ["--seeds 1,000,000,000", f"limit of {limits.MAX_SEEDS:,}"],
    "simulate nodes": ["--nodes 100,000", "1,024 ranks"],
    "profile bytes": ["--nbytes 1,125,899,906,842,624", "(1 TiB) an experiment"],
    "profile repeats": ["--repeats 1,000,000,000", f"limit of {limits.MAX_REPEATS:,}"],
    "catalog nodes": ["--nodes 100,000", f"{limits.MAX_TOPOLOGY_RANKS:,} ranks"],
    "demo tokens": ["--tokens 100,000,000", "(1 TiB) a rank"],
}

# Runs every case in one interpreter with every builder a command could reach replaced by one
# that fails: a refusal must come before any of them.
SCRIPT = r"""
import contextlib, io, json, sys
from variopath_jax import workloads
from variopath_jax.topology import PathModel
import variopath_jax.bench.harness as harness
import variopath_jax.profile as profile
import variopath_jax.solver.gap as gap
from variopath_jax.cli import main

def never(*args, **kwargs):
    raise AssertionError("built something before refusing")

PathModel.__init__ = never
for name in ("uniform", "moe", "zipf", "sp", "load_demand"):
    setattr(workloads, name, never)
harness.run_points = never
profile.measure = never
gap.run_gap = never
out = {}
for name, argv in json.loads(sys.argv[1]).items():
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            rc = main(argv)
        except SystemExit as e:
            rc = e.code
    out[name] = [rc, err.getvalue()]
print(json.dumps(out))
"""


def test_every_command_refuses_absurd_sizes_at_once(tmp_path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, json.dumps(CASES)],
        capture_output=True,
        text=True,
        timeout=300,  # generous: the refusals themselves take milliseconds after the imports
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout)
    for name, (rc, err) in results.items():
        assert rc == 2, (name, err)
        assert err.startswith("variopath: error:"), (name, err)
        assert "past the limit" in err or "does up to" in err, (name, err)
        for text in EXPECT[name]:
            assert text in err, (name, text, err)
    assert set(results) == set(CASES)


def test_sizes_within_the_limits_pass() -> None:
    """The defaults and the largest accepted sizes are not refused."""
    from variopath_jax.cli import build_parser
    from variopath_jax.topology import preset

    parser = build_parser()
    for argv, topo in (
        (["run", "--topology", "r5080-bf3", "--scheduler", "nccl", "--workload", "zipf",
          "--bytes-per-rank", "1TiB", "--nodes", "128"], preset("r5080-bf3", 128)),
        (["topo", "show", "r5080-bf3", "--nodes", "2048"], preset("r5080-bf3", 2048)),
        (["gap", "--topology", "r5080-bf3", "--nodes", "4"], preset("r5080-bf3", 4)),
        (["demo"], preset("r5080-bf3", 2)),
        (["bench", "fig7", "--seeds", "5"], None),
    ):  # fmt: skip
        limits.check_sizes(parser.parse_args(argv), topo)
