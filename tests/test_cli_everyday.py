"""Everyday use of the command line: progress reports and their switch, resource guards (refused
before the work starts, never timed), legend-less ``topo -m`` input, the small messages, catalog
file permissions, "best found" wording for MILP results, and the demo's story."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from variopath_jax import progress, runner, workloads
from variopath_jax.catalog import CatalogError, build_catalog, store
from variopath_jax.cli import demo as demo_cli
from variopath_jax.cli import gap as gap_cli
from variopath_jax.cli import main, wants_progress
from variopath_jax.cli import topo as topo_cli
from variopath_jax.errors import VarioPathError
from variopath_jax.solver import bound as bound_module
from variopath_jax.solver.channels import SolverError
from variopath_jax.solver.gap import GapRow, summarize
from variopath_jax.topology import PathModel, preset


def run_json(capsys, *argv: str) -> dict:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


# ----- progress ----------------------------------------------------------------------------
RUN = ["run", "--topology", "fig1", "--scheduler", "nccl", "--workload", "uniform"]


def test_progress_switch(capsys, monkeypatch) -> None:
    """Off when piped or under --json unless --progress asks; lines on stderr when asked."""
    monkeypatch.setattr(progress, "LINE_DELAY_S", 0.0)  # announce every task at once
    assert main(RUN) == 0
    assert capsys.readouterr().err == ""  # stderr is not a terminal here: off by default
    assert main([*RUN, "--progress"]) == 0
    err = capsys.readouterr().err
    assert "variopath: planning with nccl ..." in err and "simulating under pcie: done" in err
    assert main([*RUN, "--json"]) == 0
    assert capsys.readouterr().err == ""
    assert main([*RUN, "--json", "--progress"]) == 0
    captured = capsys.readouterr()
    assert "planning with nccl" in captured.err and json.loads(captured.out)["valid"]
    assert not progress.enabled()  # main turns it off again


def test_progress_defaults_follow_the_terminal(monkeypatch) -> None:
    from variopath_jax.cli import build_parser

    parser = build_parser()
    monkeypatch.setattr(sys, "stderr", _Terminal())
    assert wants_progress(parser.parse_args(RUN))
    assert not wants_progress(parser.parse_args([*RUN, "--json"]))
    assert not wants_progress(parser.parse_args([*RUN, "--no-progress"]))
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert not wants_progress(parser.parse_args(RUN))
    assert wants_progress(parser.parse_args([*RUN, "--progress"]))


def test_progress_reporters() -> None:
    """Off: tasks are no-ops. On a terminal: rich bars, nested tasks allowed."""
    with progress.task("quiet", total=3) as t:
        t.advance()
    stream = _Terminal()
    progress.configure(True, stream)
    try:
        assert progress.enabled()
        with progress.task("outer", total=2) as outer:
            with progress.task("inner") as inner:
                inner.update(5, "inner: 5 found")
            outer.advance(2)
    finally:
        progress.configure(False)
    assert not progress.enabled()


def test_catalog_build_reports_progress(capsys, monkeypatch) -> None:
    monkeypatch.setattr(progress, "LINE_DELAY_S", 0.0)
    assert main(["catalog", "build", "fig1", "--progress"]) == 0
    assert "building the flat catalog of fig1 (profiles) ..." in capsys.readouterr().err


# ----- resource guards ---------------------------------------------------------------------
def _never(*args, **kwargs):
    raise AssertionError("a guard must refuse before this work starts")


def test_topo_show_summarises_at_scale(capsys) -> None:
    out = run_json(capsys, "topo", "show", "r5080-bf3", "--nodes", "1000")
    assert out["summary"] and out["gpus"] == 8000 and out["group_count"] == 4000
    assert "relations" not in out and "groups" not in out
    assert len(out["node_relations"]) == 8 and out["node_groups"] == [
        [0, 1],
        [2, 3],
        [4, 5],
        [6, 7],
    ]
    per_node = PathModel(preset("r5080-bf3")).class_counts()
    assert out["paths"]["PIX"] == 1000 * per_node["PIX"]
    two = PathModel(preset("r5080-bf3", 2)).class_counts()  # one ordered pair of nodes, twice
    assert out["paths"]["NET"] == 1000 * 999 * two["NET"] // 2
    assert any("--full" in n for n in out["notes"])
    small = run_json(capsys, "topo", "show", "fig1", "--summary")
    assert small["summary"] and "relations" not in small


def test_topo_show_full_is_refused_past_its_limit(capsys, monkeypatch) -> None:
    monkeypatch.setattr(PathModel, "class_counts", _never)
    assert main(["topo", "show", "r5080-bf3", "--nodes", "1000", "--full"]) == 2
    err = capsys.readouterr().err
    assert "8,000 ranks" in err and "--summary" in err and f"{topo_cli.MAX_FULL_RANKS:,}" in err


def test_class_counts_do_not_depend_on_the_scaling_shortcut() -> None:
    """class_counts (from node 0's pairs) equals the sum over every ordered group pair."""
    for topo in (preset("fig1", 3), preset("r5080-bf3", 2), preset("root4-gen4", 3)):
        for policy in ("nearest", "all"):
            model = PathModel(topo, nic_policy=policy)
            brute: dict[str, int] = {}
            for a, ga in enumerate(model.groups):
                for d, gd in enumerate(model.groups):
                    pairs = len(ga) * len(gd) - (len(ga) if a == d else 0)
                    for r in model.routes(a, d) if pairs else ():
                        brute[r.cls] = brute.get(r.cls, 0) + pairs
            assert model.class_counts() == brute


def test_run_is_refused_past_the_rank_limit(capsys, monkeypatch) -> None:
    monkeypatch.setattr(workloads, "moe", _never)  # no N×N demand is ever built
    argv = ["run", "--topology", "r5080-bf3", "--nodes", "1000", "--scheduler", "nccl"]
    assert main([*argv, "--workload", "moe"]) == 2
    err = capsys.readouterr().err
    assert "8,000 ranks" in err and f"{runner.MAX_RANKS:,} ranks" in err and "--nodes 128" in err
    assert "topo show --summary" in err and "catalog build" in err
    with pytest.raises(VarioPathError, match="8,000 ranks"):
        runner.check_size(preset("r5080-bf3", 1000))
    runner.check_size(preset("r5080-bf3", runner.MAX_RANKS // 8))


def test_flat_catalogs_past_the_limit_are_refused_before_the_search(monkeypatch) -> None:
    from variopath_jax.catalog import catalog as catalog_module
    from variopath_jax.topology import Topology

    monkeypatch.setattr(catalog_module, "enumerate_profiles", _never)
    monkeypatch.setattr(catalog_module, "enumerate_families", _never)
    with pytest.raises(CatalogError, match=r"8 rank groups.*factored"):
        build_catalog(preset("r5080-bf3", 2), kind="flat")
    over = Topology(preset("r5080-bf3").node, 2, oversubscription=2.0)
    with pytest.raises(CatalogError, match=r"oversubscribed.*peer scheduler"):
        build_catalog(over)  # auto: an oversubscribed fabric needs the flat catalog


def test_flow_lp_past_the_solver_limit(monkeypatch) -> None:
    topo = preset("fig1")
    demand = workloads.uniform(6, 1 << 20)
    monkeypatch.setattr(bound_module, "MAX_LP_VARIABLES", 10)
    monkeypatch.setattr(bound_module, "flow_lp", _never)
    with pytest.raises(SolverError, match=r"past the solver's limit.*endpoint bound"):
        bound_module.lower_bound(demand, topo, lp=True)
    auto = bound_module.lower_bound(demand, topo)  # the endpoint bound, at any size
    assert auto.lp_relay_s is None and auto.best_s == auto.simple_s > 0


# ----- inputs and small messages -----------------------------------------------------------
def test_topo_show_notes_a_missing_nic_legend(capsys, fixtures) -> None:
    out = run_json(capsys, "topo", "show", str(fixtures / "nvsmi_4gpu_1nic_no_nic_legend.txt"))
    assert out["nics"] == 1 and out["nic_names"] == ["NIC0"]
    assert any("no 'NIC Legend:' block" in n for n in out["notes"])
    assert main(["topo", "show", str(fixtures / "nvsmi_4gpu_1nic_no_nic_legend.txt")]) == 0
    assert "note: " in capsys.readouterr().out


def test_demand_files_and_sizes_get_clear_messages(capsys, tmp_path) -> None:
    junk = tmp_path / "junk.npy"
    junk.write_bytes(b"not numpy at all")
    objects = tmp_path / "objects.npy"
    np.save(objects, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    base = ["run", "--topology", "fig1", "--scheduler", "nccl", "--demand"]
    assert main([*base, str(junk)]) == 2
    err = capsys.readouterr().err
    assert "not a NumPy .npy file" in err and "pickle" not in err
    assert main([*base, str(objects)]) == 2
    assert "object array" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*RUN, "--bytes-per-pair", "12XB"])
    err = capsys.readouterr().err
    assert "'12XB'" in err and "KiB, MiB, GiB" in err and "KB, MB, GB" in err


def test_topo_convert_says_what_it_wrote(capsys, tmp_path) -> None:
    target = tmp_path / "fig1.json"
    assert main(["topo", "convert", "fig1", "--to", "spec", "-o", str(target)]) == 0
    out = capsys.readouterr().out
    assert f"wrote {target}" in out and f"{target.stat().st_size:,} bytes" in out


def test_catalog_files_are_readable_like_other_outputs(tmp_path) -> None:
    old = os.umask(0o022)
    try:
        store.save(build_catalog(preset("fig1")), tmp_path / "fig1.vpcat")
        (tmp_path / "other.txt").write_text("x")
    finally:
        os.umask(old)
    assert (tmp_path / "fig1.vpcat").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "other.txt").stat().st_mode & 0o777 == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fig1.vpcat", "other.txt"]


def test_simulate_validates_for_real(capsys, tmp_path) -> None:
    saved = tmp_path / "s.json"
    run_json(capsys, *RUN, "--save-schedule", str(saved))
    out = run_json(capsys, "simulate", "--topology", "fig1", "--schedule", str(saved))
    assert out["valid"] and out["errors"] == [] and out["plan_s"] is None  # nccl records none
    assert main(["simulate", "--topology", "r5080-bf3", "--schedule", str(saved)]) == 2
    assert "the schedule is for 6 ranks, the topology has 8" in capsys.readouterr().err


# ----- gap wording -------------------------------------------------------------------------
def _gap_row(status: str, gap: float, seed: int = 0) -> GapRow:
    return GapRow(
        8.0, seed, 1.0, 0.5, 6, 0.98, status, 0.1, 0.9, 0.97, 9, 1.0,
        0.9, 0.9 * (1 - gap), gap, "kslot", "FEASIBLE", "kslot", 1.0,
        0.5, 0.98, 1.96, 0.9, 0.5,
    )  # fmt: skip


def test_gap_says_certified_only_when_proven(capsys) -> None:
    mixed = summarize([_gap_row("OPTIMAL", 0.0), _gap_row("FEASIBLE", 0.2, 1)])
    assert mixed["overall"]["reference"] == "best found" and mixed["overall"]["certified"] == 1
    assert mixed["overall"]["worst_channel_gap"] == 0.2
    out = {"topology": "t", "nodes": 1, "skew": 0.6, "time_limit_s": 5.0, "contention": "pcie"}
    assert "certified" not in gap_cli.headline(mixed["overall"], 5.0)
    gap_cli.human(out | mixed)
    text = capsys.readouterr().out
    assert "1/2" in text and "1 of 2 epoch-model optima were proven" in text
    assert "20.0%" in text  # the proven channel gap is shown
    proven = summarize([_gap_row("OPTIMAL", 0.0)])
    assert proven["overall"]["reference"] == "certified optimum"
    gap_cli.human(out | proven)
    assert "Every epoch-model optimum is certified" in capsys.readouterr().out


def test_tables_split_instead_of_cutting() -> None:
    from rich.console import Console

    from variopath_jax.cli.common import print_table

    buf = io.StringIO()
    narrow = Console(file=buf, width=40, color_system=None)
    columns = [("scheduler", "left")] + [(f"column {k}", "right") for k in range(6)]
    rows = [["variopath-fixed-path", *map(str, range(6))], ["variopath-fixed-peer", *"abcdef"]]
    print_table(narrow, columns, rows, title="t")
    text = buf.getvalue()
    assert "…" not in text and text.count("variopath-fixed-peer") > 1  # keys repeat per block
    assert all(f"column {k}" in text for k in range(6))
    assert max(len(line) for line in text.splitlines()) <= 40


# ----- the demo ----------------------------------------------------------------------------
def _row(name: str, pcie_s: float, none_s: float) -> dict:
    return {
        "scheduler": name,
        "valid": True,
        "completion_s": pcie_s,
        "none_completion_s": none_s,
        "bound_fraction": 0.1 / pcie_s,
        "none_bound_fraction": 0.1 / none_s,
    }


def test_demo_story_follows_the_numbers() -> None:
    rows = [_row("variopath", 0.3, 0.3), _row("nccl", 0.2, 0.2), _row("pairwise", 0.9, 0.3)]
    lines = demo_cli.story(rows, "pcie")
    assert "the fastest is nccl" in lines[0] and "is 1.50x slower than it" in lines[0]
    assert lines[2].startswith("What contention changes: pairwise loses most, 3.00x")
    rows = [_row("variopath", 0.2, 0.2), _row("nccl", 0.3, 0.2), _row("fast", 0.25, 0.25)]
    lines = demo_cli.story(rows, "pcie")
    assert lines[0].startswith("Under pcie (") and "VarioPath is the fastest" in lines[0]
    assert "1.50x faster than nccl" in lines[0] and "the strongest peer, fast" in lines[0]
    assert "ties with the strongest peer, nccl" in lines[1]
    # VarioPath leads only under pcie-fair: that sentence says so; the trigger's cost is named
    rows = [
        _row("variopath", 0.3, 0.1) | {"fair_completion_s": 0.1, "fair_bound_fraction": 1.0},
        _row("nccl", 0.2, 0.2) | {"fair_completion_s": 0.2, "fair_bound_fraction": 0.5},
    ]
    lines = demo_cli.story(rows, "pcie")
    assert lines[0].startswith("Under pcie (") and "the fastest is nccl" in lines[0]
    assert lines[1].startswith("Under pcie-fair (") and "VarioPath is the fastest" in lines[1]
    assert lines[1].endswith(
        "This holds only under pcie-fair: under pcie VarioPath is 1.50x slower than nccl."
    )
    assert lines[4].startswith("What the posted-write trigger changes: variopath is 3.00x slower")


def test_demo_prints_both_models_and_names_its_plots(tmp_path) -> None:
    """The demo as `make demo` runs it, in a fresh process (generous timeout, not a timing)."""
    exe = Path(sys.executable).parent / "variopath"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "variopath_jax.cli"]
    proc = subprocess.run(
        [*cmd, "demo", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "COLUMNS": "80"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "Under pcie (calibrated" in out and "Under none (ideal" in out
    assert "variopath-fixed-path" in out and "variopath-fixed-peer" in out  # rows not cut
    assert "…" not in out
    assert str(tmp_path / "link_utilisation_variopath.png") in out
    assert (tmp_path / "link_utilisation_variopath.png").stat().st_size > 10_000
    assert "matches NumPy" in out
