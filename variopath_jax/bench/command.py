"""``variopath bench SUITE... [--quick] [--out DIR] [--json] [--seeds K]``: the paper's §6 suites
in the simulator. Each suite writes ``<out>/<suite>/``: ``<suite>.csv`` (every run),
``<suite>.png`` (the figure), ``summary.md`` and ``summary.json``; with several suites
``<out>/summary.md`` gathers their sections."""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from variopath_jax import progress as reporting
from variopath_jax.bench.suites import SUITES, Suite, resolve
from variopath_jax.sim import NETWORK_MODELS, NetworkModel, load_networks

DEFAULT_OUT = "out/bench"
DEFAULT_MODELS = ",".join(NETWORK_MODELS)  # pcie,pcie-fair,none: every named model


def add_bench_parser(sub: argparse._SubParsersAction, command: Callable) -> None:
    """Register ``bench`` with the CLI's ``command(subparsers, name, handler, help, human)``."""
    p = command(
        sub,
        "bench",
        cmd_bench,
        "run the paper's evaluation suites (§6) in the simulator",
        human_bench,
    )
    p.add_argument("suites", nargs="+", metavar="SUITE", help=f"{', '.join(SUITES)}, or all")
    p.add_argument(
        "--quick", action="store_true", help="a representative subset: few sizes, one seed"
    )
    p.add_argument(
        "--out", default=DEFAULT_OUT, help=f"results go to OUT/SUITE/ (default {DEFAULT_OUT})"
    )
    p.add_argument(
        "--seeds", type=int, default=None, help="seeds per random point (default: the suite's)"
    )
    p.add_argument(
        "--contention",
        default=DEFAULT_MODELS,
        help="network models to simulate under, side by side, comma-separated: pcie, "
        f"pcie-fair, none or a JSON file (default {DEFAULT_MODELS})",
    )
    p.add_argument("--limit", type=int, default=None, help=argparse.SUPPRESS)  # tests: N points


def _command_line(args: argparse.Namespace) -> str:
    parts = ["variopath bench", *args.suites]
    if args.quick:
        parts.append("--quick")
    if args.seeds is not None:
        parts.append(f"--seeds {args.seeds}")
    if args.out != DEFAULT_OUT:
        parts.append(f"--out {args.out}")
    if args.contention != DEFAULT_MODELS:
        parts.append(f"--contention {args.contention}")
    if args.limit is not None:
        parts.append(f"--limit {args.limit}")
    return " ".join(parts)


def run_suite(
    suite: Suite,
    out_dir: Path,
    *,
    quick: bool,
    seeds: int | None,
    limit: int | None,
    command_line: str,
    networks: list[NetworkModel],
    progress: Callable[[str, int], None] | None = None,
) -> dict[str, Any]:
    """Run one suite and write its CSV, plot and summaries to ``out_dir``; its summary."""
    # imported here: the solver (OR-Tools) and matplotlib are slow to import for other commands
    from variopath_jax.bench.harness import run_points, write_csv
    from variopath_jax.bench.plots import plot_suite
    from variopath_jax.bench.summary import markdown, summarize

    start = time.perf_counter()
    points = suite.points(quick, seeds)[:limit]
    rows = run_points(suite, points, networks=networks, progress=progress)
    wall_s = time.perf_counter() - start
    out_dir.mkdir(parents=True, exist_ok=True)
    write_csv(rows, out_dir / f"{suite.name}.csv")
    plot_suite(suite, rows, out_dir / f"{suite.name}.png")
    summary = summarize(suite, rows)
    summary["wall_s"] = wall_s
    summary["files"] = {
        "csv": str(out_dir / f"{suite.name}.csv"),
        "plot": str(out_dir / f"{suite.name}.png"),
        "markdown": str(out_dir / "summary.md"),
    }
    text = _header(command_line, wall_s, networks) + markdown(summary, [f"{suite.name}.png"])
    (out_dir / "summary.md").write_text(text)
    (out_dir / "summary.json").write_text(json.dumps(_finite(summary), indent=1) + "\n")
    return summary


def _header(command_line: str, wall_s: float, networks: list[NetworkModel]) -> str:
    net = networks[0]
    return (
        f"Produced by `{command_line}` in {wall_s:.0f} s; every system simulated under the "
        f"network models {', '.join(f'`{n.name}`' for n in networks)} (docs/simulator.md), with "
        f"λ = {net.barrier_s * 1e6:g} µs per barrier, o = {net.issue_s * 1e6:g} µs per post, "
        f"L = {net.latency_pcie_s * 1e6:g} µs over PCIe and {net.latency_net_s * 1e6:.2f} µs "
        f"through a NIC, σ = {net.signal_s * 1e6:g} µs per signal.\n\n"
    )


def _finite(obj: Any) -> Any:
    """``obj`` with NaN floats as None (JSON has no NaN)."""
    if isinstance(obj, float) and math.isnan(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    return obj


def cmd_bench(args: argparse.Namespace) -> dict[str, Any]:
    """Run the named suites; the summary rows of each."""
    suites = resolve(args.suites)
    networks = list(load_networks(args.contention))
    plans = [(s, len(s.points(args.quick, args.seeds)[: args.limit])) for s in suites]
    total = sum(n * len(s.systems) for s, n in plans)
    root = Path(args.out)
    command_line = _command_line(args)
    start = time.perf_counter()
    summaries = []
    with reporting.task("bench", total=total) as task:

        def progress(label: str, done: int) -> None:
            task.advance(done, f"bench: {label}")

        for suite in suites:
            summary = run_suite(
                suite,
                root / suite.name,
                quick=args.quick,
                seeds=args.seeds,
                limit=args.limit,
                command_line=command_line,
                networks=networks,
                progress=progress,
            )
            summaries.append(summary)
    wall_s = time.perf_counter() - start
    if len(summaries) > 1:
        from variopath_jax.bench.summary import markdown

        sections = [markdown(s, [f"{s['suite']}/{s['suite']}.png"]) for s in summaries]
        (root / "summary.md").write_text(
            "# variopath bench\n\n" + _header(command_line, wall_s, networks) + "\n".join(sections)
        )
    return _finite(
        {
            "command": command_line,
            "quick": args.quick,
            "contention": [n.name for n in networks],
            "networks": [n.to_dict() for n in networks],
            "wall_s": wall_s,
            "suites": summaries,
        }
    )


def human_bench(out: dict[str, Any]) -> None:
    """Tables of speedups and bound fractions per suite."""
    from variopath_jax.bench.summary import side_by_side
    from variopath_jax.cli.common import console, print_table

    out_console = console()
    columns = [
        ("system", "left"),
        ("model", "left"),
        ("points", "right"),
        ("geomean", "right"),
        ("range", "right"),
        ("VarioPath faster", "right"),
        ("paper", "left"),
    ]
    for s in out["suites"]:
        rows = [
            [
                r["system"],
                r["contention"],
                str(r["points"]),
                _times(r["geomean"])
                + (f" ({_times(r['at_geomean'])} at {r['at']:g})" if "at" in r else ""),
                f"{_times(r['min'])}-{_times(r['max'])}",
                f"{r['wins']}/{r['points']}",
                _times(r["paper"]) + (f" at {r['at']:g}" if "at" in r else ""),
            ]
            for r in side_by_side(s["speedups"])
        ]
        print_table(
            out_console,
            columns,
            rows,
            keys=2,
            title=f"{s['suite']}: {s['title']} ({s['points']} points, {s['wall_s']:.0f} s)",
            caption="speedup = system time / VarioPath time (below 1: VarioPath is slower); "
            "VarioPath's time is plan + communication, peers' communication",
        )
        planning = ", ".join(
            f"{p['system']} {p['plan_s'] * 1e3:.3f} ms over {p['completion_s'] * 1e3:.3f} ms "
            f"({p['contention']})"
            for p in s.get("planning", [])
        )
        if planning:
            out_console.print(f"planning over communication (medians): {planning}", highlight=False)
        fractions = ", ".join(
            f"{b['system']} {b['geomean']:.0%} ({b['contention']})"
            for b in s["bound_fraction"]
            if b["points"]
        )
        out_console.print(f"fraction of the lower bound (geomean): {fractions}", highlight=False)
        for f in s["failures"]:
            out_console.print(
                f"[yellow]{f['deployment']} {f['system']} ({f['runs']} runs): {f['error']}"
            )
        out_console.print(
            f"files: {s['files']['csv']}, {s['files']['plot']}, {s['files']['markdown']}",
            highlight=False,
        )


def _times(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"
