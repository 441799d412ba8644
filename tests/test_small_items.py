"""The small rough edges of issue 53, each pinned: ``top_k=0`` is a clear error; a timeout is
DEADLINE_EXCEEDED naming the timeout; ``variopath gap`` says why VarioPath can exceed the epoch
model's optimum and fits 100 columns; a tall heat map fills its panel; a quick bench run's title
names only the GPU counts it shows; ``plan --scheduler nccl`` prints no O/C."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import jax
import matplotlib
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from test_cli_everyday import _gap_row

from variopath_jax.bench import plots
from variopath_jax.bench.suites import SUITES, gpu_counts
from variopath_jax.cli import gap as gap_cli
from variopath_jax.cli import main
from variopath_jax.errors import VarioPathError
from variopath_jax.layers.moe import init_moe, moe_block, moe_reference
from variopath_jax.solver.gap import summarize

matplotlib.use("Agg")
N = 8


def test_top_k_zero_is_a_clear_error() -> None:
    if jax.device_count() < N:
        pytest.skip("needs 8 host devices (XLA_FLAGS)")
    mesh = jax.make_mesh((N,), ("ep",), axis_types=(jax.sharding.AxisType.Explicit,))
    params = init_moe(0, 4, 8, N)  # one expert per device
    pspec = type(params)(P(), P("ep"), P("ep"))
    ps = jax.tree.map(lambda a, s: jax.device_put(a, NamedSharding(mesh, s)), params, pspec)
    x = jax.device_put(np.zeros((N * 2, 4), np.float32), NamedSharding(mesh, P("ep")))
    for bad in (0, -1, N + 1, 1.5, True):
        block = jax.shard_map(
            lambda x, p, k=bad: moe_block(x, p, axis_name="ep", top_k=k)[0],
            mesh=mesh,
            in_specs=(P("ep"), pspec),
            out_specs=P("ep"),
        )
        with pytest.raises(VarioPathError, match=rf"top_k must be .* in \[1, {N}\].*{bad!r}"):
            jax.jit(block)(x, ps)
    with pytest.raises(VarioPathError, match="top_k must be"):
        moe_reference(np.zeros((2, 4), np.float32), params, top_k=0)


TIMEOUT_SCRIPT = """
import os
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
import jax, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
from variopath_jax.jax_ops import all_to_all_v, configure
configure(devices=4, timeout_s=1.0)
mesh = jax.make_mesh((4,), ("x",), axis_types=(jax.sharding.AxisType.Explicit,))
put = lambda a: jax.device_put(a, NamedSharding(mesh, P("x")))
def body(x, c):  # rank 2 skips the exchange: the others wait for it until the timeout
    return jax.lax.cond(jax.lax.axis_index("x") == 2, lambda: x * 0,
                        lambda: all_to_all_v(x, c[0], axis_name="x")[0])
f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("x"), P("x")), out_specs=P("x")))
try:
    f(put(np.zeros((16,), np.float32)), put(np.ones((4, 4), np.int32))).block_until_ready()
    print("NO ERROR")
except Exception as err:
    print("ERROR", str(err).splitlines()[0][:400])
"""


def test_a_timeout_is_deadline_exceeded_and_names_the_timeout(tmp_path) -> None:
    script = tmp_path / "timeout.py"
    script.write_text(textwrap.dedent(TIMEOUT_SCRIPT))
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=180
    )
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("ERROR")), "")
    assert line.startswith("ERROR DEADLINE_EXCEEDED:"), (proc.stdout, proc.stderr[-2000:])
    assert "timed out after 1" in line


def test_gap_explains_above_100_percent_and_fits_100_columns(capsys) -> None:
    rows = summarize([_gap_row("OPTIMAL", 0.0), _gap_row("FEASIBLE", 0.2, 1)])
    out = {"topology": "r5080-bf3", "nodes": 1, "skew": 0.6, "time_limit_s": 5.0}
    gap_cli.human(out | {"contention": "pcie"} | rows)
    text = capsys.readouterr().out
    assert "Why VarioPath can exceed 100% of the epoch model's optimum" in text
    assert "not a bound on VarioPath" in text
    assert max(len(line) for line in text.splitlines()) <= gap_cli.TABLE_WIDTH
    assert "VP/epoch" in text and "VP/LP" in text  # every column still shown, split over tables


def test_a_tall_heat_map_fills_its_panel() -> None:
    import matplotlib.pyplot as plt

    from variopath_jax import viz

    fig, axes = plt.subplots(1, 2, figsize=(9, 4), width_ratios=(1, 2), layout="constrained")
    sizes = np.arange(16).reshape(8, 2)  # (device, local expert): notebook 05's first panel
    image = viz.draw_matrix(axes[0], sizes, title="rows received per local expert")
    viz.draw_matrix(axes[1], np.ones((8, 8)), blocks=2)
    fig.canvas.draw()
    panel = axes[0].get_window_extent()
    drawn = image.get_window_extent()
    assert drawn.width * drawn.height >= 0.9 * panel.width * panel.height
    assert axes[0].get_xlim() == (-0.5, 1.5) and list(axes[0].get_xticks()) == [0, 1]
    assert len(axes[0].get_yticks()) == 8
    square = axes[1].get_window_extent()
    assert abs(square.width - square.height) < 2  # a square matrix keeps square cells
    plt.close(fig)


def test_quick_bench_titles_name_only_the_gpu_counts_shown(tmp_path) -> None:
    suite = SUITES["fig7"]
    quick = {(p.topology, p.nodes) for p in suite.points(quick=True)}
    assert quick == {("r5080-bf3", 4)}
    rows = [
        {"topology": "r5080-bf3", "nodes": 4, "ranks": 32, "scheduler": s.label, "seed": 0,
         "tokens": m, "mib_per_rank": m, "skew": 0.6, "payload_per_rank": m * 14336.0,
         "algbw_gbps": 1.0, "completion_s": 1.0, "valid": True, "contention": "pcie"}
        for s in suite.systems
        for m in (1.0, 16.0)
    ]  # fmt: skip
    assert suite.title_for(rows) == "Figure 7: MoE AlltoAllv (random top-8 routing), 32 GPUs"
    assert gpu_counts([*rows, {"ranks": 64}, {"ranks": 16}]) == "16, 32 and 64 GPUs"
    fig = plots.figure(suite, rows)
    assert fig._suptitle.get_text() == f"{suite.title_for(rows)} (simulated)"
    assert "64" not in fig._suptitle.get_text()
    for s in SUITES.values():  # no title claims deployments: title_for adds what a run shows
        assert "GPUs" not in s.title and "four platforms" not in s.title


def test_plan_prints_no_o_over_c_for_a_peer(capsys) -> None:
    base = ["plan", "--topology", "fig1", "--workload", "uniform"]
    assert main([*base, "--scheduler", "nccl"]) == 0
    text = capsys.readouterr().out
    assert "O/C" not in text and "nccl plans nothing per call" in text
    assert main([*base, "--scheduler", "nccl", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["plan_over_comm"] is None
    assert main([*base, "--scheduler", "variopath"]) == 0
    assert "O/C" in capsys.readouterr().out
