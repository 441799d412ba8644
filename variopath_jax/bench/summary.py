"""Summaries of suite results: geomean speedups of VarioPath over each system, its fraction of the
lower bound, and the markdown report beside the paper's claims.

A speedup is a time ratio, system / VarioPath, over matched points (same deployment, workload
parameters, seed and network model, both runs successful and valid): above 1 VarioPath is
faster, below 1 it loses. Planning is on the critical path of every call (issue 28), so the time
of VarioPath's own systems (``variopath*``) is plan + communication (:func:`charged`); a peer is
charged its communication only, since its runtime plans nothing our Python stand-ins measure
(the conservative side for VarioPath). The robust choice's regret against ``variopath`` compares
communication only: both plan. Every figure is given per network model (``contention``: by default the
conservative ``pcie``, ``pcie-fair`` without the posted-write trigger and the ideal ``none``), side by side.

``variopath`` is planned for the model it is judged under; ``variopath-robust`` is planned once,
without knowing the model, and judged under each. Its row among the speedups is its regret
against ``variopath`` (robust time / variopath's), and ``robust`` compares it with the best peer
at every point.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from variopath_jax.bench.suites import Suite

Row = dict[str, Any]

# a point's columns; rows read from older CSVs may lack "step"
_POINT_KEY = ("topology", "nodes", "tokens", "mib_per_rank", "skew", "step", "seed")
ROBUST = "variopath-robust"
_DEFAULT_MODEL = "pcie"  # rows without a "contention" column were simulated under it


def model_of(row: Row) -> str:
    """The network model a row was simulated under."""
    return row.get("contention") or _DEFAULT_MODEL


def geomean(values: Iterable[float]) -> float:
    """The geometric mean of positive values (nan when there are none)."""
    logs = [math.log(v) for v in values]
    return math.exp(sum(logs) / len(logs)) if logs else math.nan


def ok(row: Row) -> bool:
    """A successful, valid run with a positive completion time."""
    return not row.get("error") and bool(row.get("valid")) and (row.get("completion_s") or 0) > 0


def deployment(row: Row) -> str:
    return f"{row['topology']} x{row['nodes']}"


def swept_value(suite: Suite, row: Row) -> float:
    """The value ``row``'s suite sweeps: tokens M, MiB per rank, skew s or trace step."""
    if suite.workload == "trace":
        return row["step"]
    return {"moe": row["tokens"], "uniform": row["mib_per_rank"], "zipf": row["skew"]}[
        suite.workload
    ]


def charged(row: Row) -> float:
    """The time a run is charged: completion, plus its planning for VarioPath's systems."""
    mine = str(row["scheduler"]).startswith("variopath")
    plan = (row.get("plan_s") or 0.0) if mine else 0.0
    return row["completion_s"] + plan


def ratios(
    rows: list[Row], system: str, reference: str, planning: bool = True
) -> list[tuple[Row, float]]:
    """(the system's row, its charged time / the reference's) at every matched point; with
    ``planning=False`` communication time only (the robust choice's regret: both plan)."""
    time_of = charged if planning else (lambda r: r["completion_s"])
    ref = {tuple(r.get(k) for k in _POINT_KEY): r for r in rows if r["scheduler"] == reference}
    out = []
    for r in rows:
        if r["scheduler"] != system or not ok(r):
            continue
        base = ref.get(tuple(r.get(k) for k in _POINT_KEY))
        if base is not None and ok(base):
            out.append((r, time_of(r) / time_of(base)))
    return out


def _stats(values: list[float]) -> dict[str, Any]:
    return {
        "points": len(values),
        "geomean": geomean(values),
        "min": min(values) if values else math.nan,
        "max": max(values) if values else math.nan,
    }


def summarize(suite: Suite, rows: list[Row]) -> dict[str, Any]:
    """The summary of one suite's rows (see the module docstring for the speedup): speedups and
    bound fractions per (system, network model)."""
    models = list(dict.fromkeys(model_of(r) for r in rows))
    speedups, bound, robust = [], [], []
    for model in models:
        mine = [r for r in rows if model_of(r) == model]
        speedups += [s | {"contention": model} for s in _speedups(suite, mine)]
        if any(system.label == ROBUST for system in suite.systems):
            robust.append({"contention": model, **_robust(suite, mine)})
        for system in suite.systems:
            fr = [
                r["bound_s"] / r["completion_s"]
                for r in mine
                if r["scheduler"] == system.label and ok(r) and r.get("bound_s")
            ]
            bound.append({"system": system.label, "contention": model, **_stats(fr)})
    failures: dict[tuple, int] = defaultdict(int)
    for r in rows:
        if not ok(r):
            reason = r.get("error") or "invalid schedule"
            failures[(deployment(r), r["scheduler"], reason)] += 1
    points = {tuple(r.get(k) for k in _POINT_KEY) for r in rows}
    planning = []
    for model in models:
        for system in suite.systems:
            mine = [
                r
                for r in rows
                if model_of(r) == model and r["scheduler"] == system.label and ok(r)
                if str(system.label).startswith("variopath") and r.get("plan_s") is not None
            ]
            if mine:
                planning.append(
                    {
                        "system": system.label,
                        "contention": model,
                        "points": len(mine),
                        "plan_s": _median([r["plan_s"] for r in mine]),
                        "completion_s": _median([r["completion_s"] for r in mine]),
                        "plan_over_comm": _median([r["plan_s"] / r["completion_s"] for r in mine]),
                    }
                )
    return {
        "suite": suite.name,
        "title": suite.title_for(rows),
        "models": models,
        "points": len(points),
        "runs": len(rows),
        "failed_runs": sum(failures.values()),
        "speedups": speedups,
        "robust": robust,
        "bound_fraction": bound,
        "planning": planning,
        "failures": [
            {"deployment": d, "system": s, "error": e, "runs": n}
            for (d, s, e), n in sorted(failures.items())
        ],
    }


def _speedups(suite: Suite, rows: list[Row]) -> list[dict[str, Any]]:
    """VarioPath's speedup over each peer on rows of one network model."""
    reference = suite.systems[0].label
    claims = {c.system: c for c in suite.claims}
    speedups = []
    for system in suite.peers:
        matched = ratios(rows, system.label, reference, planning=system.label != ROBUST)
        comm = ratios(rows, system.label, reference, planning=False)
        values = [v for _, v in matched]
        per_dep: dict[str, list[float]] = defaultdict(list)
        for r, v in matched:
            per_dep[deployment(r)].append(v)
        claim = claims.get(system.label)
        entry = {
            "system": system.label,
            **_stats(values),
            "wins": sum(v > 1 for v in values),
            "losses": sum(v < 1 for v in values),
            "by_deployment": {d: geomean(vs) for d, vs in per_dep.items()},
            "median_steps": _median([r["steps"] for r, _ in matched]),
            # fractions of the bound of both systems on the matched points (bound / time)
            "bound_fraction": geomean(
                r["bound_s"] / r["completion_s"] for r, _ in matched if r["bound_s"]
            ),
            "reference_bound_fraction": geomean(
                r["bound_s"] / r["completion_s"] * v for r, v in comm if r["bound_s"]
            ),
            "paper": claim.ratio if claim else None,
            "paper_text": claim.text if claim else "",
        }
        if claim and claim.at is not None:
            at = [v for r, v in matched if swept_value(suite, r) == claim.at]
            entry["at"] = claim.at
            entry["at_geomean"] = geomean(at)
        speedups.append(entry)
    return speedups


def _robust(suite: Suite, rows: list[Row]) -> dict[str, Any]:
    """On rows of one network model: ``variopath-robust`` against the best peer at each point
    (best peer time / robust time: above 1 the robust plan is faster) and its regret against
    ``variopath`` planned for the model (robust time / variopath's)."""
    peers = [s.label for s in suite.peers if s.label != ROBUST]
    best: dict[tuple, float] = {}
    for r in rows:
        if r["scheduler"] in peers and ok(r):
            key = tuple(r.get(k) for k in _POINT_KEY)
            best[key] = min(best.get(key, math.inf), charged(r))
    versus = [
        best[key] / charged(r)
        for r in rows
        if r["scheduler"] == ROBUST
        and ok(r)
        and (key := tuple(r.get(k) for k in _POINT_KEY)) in best
    ]
    regret = [v for _, v in ratios(rows, ROBUST, suite.systems[0].label, planning=False)]
    return {
        "points": len(versus),
        "vs_best_peer": geomean(versus),
        "vs_best_peer_min": min(versus) if versus else math.nan,
        "not_slower": sum(v >= 1 for v in versus),
        "regret_points": len(regret),
        "regret_max": max(regret) if regret else math.nan,
        "regret_geomean": geomean(regret),
    }


def side_by_side(speedups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Speedup entries grouped by system, each system's network models next to each other."""
    first = {name: k for k, name in enumerate(dict.fromkeys(s["system"] for s in speedups))}
    return sorted(speedups, key=lambda s: first[s["system"]])


def _median(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


_MODEL_WORDS = {
    "pcie": "conservative contention: an uplink writing to two or more root complexes at once "
    "collapses (the posted-write trigger), paced or not",
    "pcie-fair": "the same without the posted-write trigger",
    "none": "ideal sharing",
}


def _x(value: float | None, digits: int = 2) -> str:
    return "–" if value is None or math.isnan(value) else f"{value:.{digits}f}×"


def _pct(value: float) -> str:
    return "–" if math.isnan(value) else f"{value:.0%}"


def findings(summary: dict[str, Any]) -> list[str]:
    """Plain sentences on where VarioPath wins and loses, read off the numbers."""
    out = []
    for s in summary["speedups"]:
        if not s["points"] or s["system"] == ROBUST:  # the robust choice has its own lines
            continue
        name, g = s["system"], s["geomean"]
        model = s.get("contention", _DEFAULT_MODEL)
        paper = f" (paper: {s['paper_text']})" if s["paper_text"] else ""
        if not s["wins"] and not s["losses"]:
            out.append(f"{model}: VarioPath ties with {name} on all {s['points']} points{paper}.")
            continue
        if g >= 1:
            out.append(
                f"{model}: VarioPath beats {name}: geomean {_x(g)}, faster on "
                f"{s['wins']}/{s['points']} points{paper}."
            )
            continue
        line = (
            f"{model}: **VarioPath loses to {name}**: geomean {_x(g)}, slower on {s['losses']}/"
            f"{s['points']} points{paper}."
        )
        deps = s["by_deployment"]
        won = [f"{d} ({_x(v)})" for d, v in deps.items() if v >= 1]
        if won:
            lost = [f"{d} ({_x(v)})" for d, v in deps.items() if v < 1]
            line += f" By deployment it is faster on {', '.join(won)}; slower on {', '.join(lost)}."
        if s["median_steps"] == 1:
            why = {
                "none": "the ideal model shares links max-min fairly with no contention penalty, "
                "which favours all-concurrent schedules",
                "pcie-fair": "this model has no posted-write trigger, so concurrent writes "
                "through the root complexes share them fairly",
            }.get(model, "even with the contention of oversubscribed links this model charges")
            line += (
                f" {name} runs every transfer in one concurrent step and reaches "
                f"{_pct(s['bound_fraction'])} of the lower bound on these points (VarioPath "
                f"{_pct(s['reference_bound_fraction'])}): {why}."
            )
        out.append(line)
    for r in summary.get("robust", []):
        if not r["points"]:
            continue
        model = r["contention"]
        verdict = (
            "never slower than the best peer"
            if r["not_slower"] == r["points"]
            else f"**slower than the best peer on {r['points'] - r['not_slower']}/{r['points']} "
            f"points** (worst {_x(r['vs_best_peer_min'])})"
        )
        out.append(
            f"{model}: variopath-robust (planned without knowing the model) is {verdict}, "
            f"geomean {_x(r['vs_best_peer'])} over it; its regret against variopath planned for "
            f"{model} is at most {_x(r['regret_max'])} (geomean {_x(r['regret_geomean'])})."
        )
    return out


def markdown(summary: dict[str, Any], plots: list[str]) -> str:
    """The markdown section of one suite, showing ``plots`` (paths relative to the file)."""
    lines = [
        f"## {summary['suite']}: {summary['title']}",
        "",
        f"{summary['points']} points, {summary['runs']} runs, {summary['failed_runs']} failed or "
        "unavailable. Speedup = time of the system / VarioPath's (VarioPath's systems: plan + "
        "communication; peers: communication), geomean over matched "
        "points (below 1: VarioPath is slower), under each network model: "
        + ", ".join(f"`{m}` ({_MODEL_WORDS.get(m, 'a model file')})" for m in summary["models"])
        + ". `variopath` is planned for the model it is judged under; `variopath-robust` is "
        "planned once over the unprofiled models (pcie, pcie-fair) and judged under each "
        "(its speedup row: its regret).",
        "",
        "| system | model | points | geomean speedup | range | VarioPath faster | paper |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    by_system = side_by_side(summary["speedups"])
    for s in by_system:
        at = f"; at {s['at']:g}: {_x(s['at_geomean'])}" if "at" in s else ""
        lines.append(
            f"| {s['system']} | {s.get('contention', _DEFAULT_MODEL)} | {s['points']} | "
            f"{_x(s['geomean'])}{at} | {_x(s['min'])}–{_x(s['max'])} | "
            f"{s['wins']}/{s['points']} | {s['paper_text']} |"
        )
    deps = list(dict.fromkeys(d for s in summary["speedups"] for d in s["by_deployment"]))
    if len(deps) > 1:
        lines += ["", "Geomean speedup per deployment:", ""]
        heads = [f"{s['system']} ({s.get('contention', _DEFAULT_MODEL)})" for s in by_system]
        lines.append("| deployment | " + " | ".join(heads) + " |")
        lines.append("|---|" + "---:|" * len(by_system))
        for d in deps:
            cells = [_x(s["by_deployment"].get(d)) for s in by_system]
            lines.append(f"| {d} | " + " | ".join(cells) + " |")
    if any(r["points"] for r in summary.get("robust", [])):
        lines += [
            "",
            "The robust choice (`variopath-robust`, planned without knowing the model) against "
            "the best peer at each point and against `variopath` planned for the model:",
            "",
            "| model | points | best peer / robust (geomean) | worst | not slower than the best "
            "peer | regret max | regret geomean |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for r in summary["robust"]:
            lines.append(
                f"| {r['contention']} | {r['points']} | {_x(r['vs_best_peer'])} | "
                f"{_x(r['vs_best_peer_min'])} | {r['not_slower']}/{r['points']} | "
                f"{_x(r['regret_max'])} | {_x(r['regret_geomean'])} |"
            )
    lines += [
        "",
        "Fraction of the lower bound (bound time / completion time; 100% is optimal; the bound "
        "is model-free):",
        "",
        "| system | model | points | geomean | min | max |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for b in summary["bound_fraction"]:
        lines.append(
            f"| {b['system']} | {b.get('contention', _DEFAULT_MODEL)} | {b['points']} | "
            f"{_pct(b['geomean'])} | {_pct(b['min'])} | {_pct(b['max'])} |"
        )
    if summary.get("planning"):
        lines += [
            "",
            "Planning, on the critical path of every call and counted in the speedups above "
            "(medians over the points):",
            "",
            "| system | model | points | plan ms | communication ms | plan / communication |",
            "|---|---|---:|---:|---:|---:|",
        ]
        for p in summary["planning"]:
            lines.append(
                f"| {p['system']} | {p['contention']} | {p['points']} | {p['plan_s'] * 1e3:.3f} | "
                f"{p['completion_s'] * 1e3:.3f} | {p['plan_over_comm']:.2f} |"
            )
    if summary["failures"]:
        lines += ["", "Failed or unavailable runs:", ""]
        lines += [
            f"- {f['deployment']}, {f['system']} ({f['runs']} runs): {f['error']}"
            for f in summary["failures"]
        ]
    lines += ["", *[f"- {line}" for line in findings(summary)]]
    for plot in plots:
        lines += ["", f"![{summary['suite']}]({plot})"]
    return "\n".join(lines) + "\n"
