"""``variopath catalog build|show|verify``: channel-family catalogs."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from variopath_jax import progress
from variopath_jax.cli.common import command, load_from_args, topology_args
from variopath_jax.errors import VarioPathError
from variopath_jax.topology import PathModel


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``catalog build``, ``catalog show`` and ``catalog verify``."""
    catalog = sub.add_parser("catalog", help="build, inspect and verify channel catalogs")
    cat_sub = catalog.add_subparsers(dest="catalog_command", required=True)
    build = command(
        cat_sub, "build", cmd_build, "build the channel-family catalog of a topology", human
    )
    topology_args(build)
    build.add_argument("--kind", choices=("auto", "flat", "factored"), default="auto")
    build.add_argument(
        "--method",
        choices=("profiles", "dfs"),
        default="profiles",
        help="compact rate-profile search (default) or Algorithm 1's DFS",
    )
    build.add_argument("--max-families", type=int, default=2_000_000)
    build.add_argument("--out", default=None, help="write the catalog file here")
    show = command(cat_sub, "show", cmd_show, "summarise a catalog file", human)
    show.add_argument("file")
    ver = command(
        cat_sub,
        "verify",
        cmd_verify,
        "check a small topology's catalog against a verifier",
        human_verify,
    )
    topology_args(ver)
    ver.add_argument(
        "--verifier", default="bruteforce", help="bruteforce or cpsat (OR-Tools CP-SAT)"
    )
    ver.add_argument("--method", choices=("profiles", "dfs"), default="profiles")


def cmd_build(args: argparse.Namespace) -> dict[str, Any]:
    from variopath_jax.catalog import build_catalog, store

    topo = load_from_args(args)
    cat = build_catalog(
        topo, args.kind, args.method, args.nic_policy, max_families=args.max_families
    )
    out = {"topology": topo.name, "nodes": topo.nodes, **cat.summary()}
    if args.out:
        with progress.task(f"writing {args.out}"):
            out["bytes"] = store.save(cat, args.out)
        out["file"] = args.out
    else:
        out["bytes"] = len(store.dumps(cat))
    return out


def cmd_show(args: argparse.Namespace) -> dict[str, Any]:
    from variopath_jax.catalog import store

    cat = store.load(args.file)
    out = cat.summary()
    out["bytes"] = Path(args.file).stat().st_size
    out["file"] = args.file
    return out


def human(out: dict[str, Any]) -> None:
    where = f" -> {out['file']}" if out.get("file") else ""
    print(
        f"{out['kind']} catalog{where}: fingerprint {out['fingerprint']}, {len(out['groups'])} "
        f"groups of {out['group_size']}, {out['instances']} instances, {out['shapes']} shapes, "
        f"{out['families']} families, {out['bytes'] / 1024:.1f} KiB, built in "
        f"{out['seconds']:.2f} s ({out['method']})"
    )


def cmd_verify(args: argparse.Namespace) -> dict[str, Any]:
    import variopath_jax.solver.verify  # noqa: F401  (registers the CP-SAT verifier)
    from variopath_jax.catalog import VERIFIERS, build_catalog

    topo = load_from_args(args)
    if args.verifier not in VERIFIERS:
        raise VarioPathError(
            f"unknown verifier {args.verifier!r}; available: {', '.join(sorted(VERIFIERS))}"
        )
    model = PathModel(topo, nic_policy=args.nic_policy)
    cat = build_catalog(topo, "flat", args.method, args.nic_policy)
    with progress.task(f"verifying the catalog ({args.verifier})"):
        report = VERIFIERS[args.verifier](cat, model)
    return {
        "verifier": report.method,
        "ok": report.ok,
        "sound": report.sound,
        "complete": report.complete,
        "channels": report.channels,
        "shapes_checked": report.shapes_checked,
        "shapes": len(cat.shapes),
        "families": len(cat.families),
        "problems": report.problems,
    }


def human_verify(out: dict[str, Any]) -> None:
    checked = (
        f"{out['shapes_checked']} admissible shapes"
        if out["verifier"] == "cpsat"
        else f"{out['channels']} feasible channels"
    )
    print(
        f"{out['verifier']}: sound={out['sound']} complete={out['complete']} ({checked}, "
        f"{out['shapes']} shapes, {out['families']} families)"
    )
    for p in out["problems"][:10]:
        print("  ", p)
