"""``variopath profile``: measure the machine (or the emulated one), fit the network model and
write its file and the path profile (docs/simulator.md "Profiling your machine"); ``--refit``
fits again from the raw measurements a file keeps."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

from variopath_jax import progress
from variopath_jax.cli.common import command, parse_size
from variopath_jax.cli.limits import check_sizes
from variopath_jax.errors import VarioPathError


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``profile``."""
    p = command(
        sub,
        "profile",
        cmd_profile,
        "measure link rates, losses under k concurrent flows and per-message costs; write the "
        "network-model file and path profile",
        human,
    )
    p.add_argument(
        "--backend",
        choices=("emulated", "cuda"),
        default="emulated",
        help="emulated: a machine with injected parameters on a virtual clock (default); cuda: "
        "copies between this process's GPUs",
    )
    p.add_argument(
        "--out",
        default=None,
        metavar="FILE",
        help="write the network-model file here (default: profile-network.json when measuring; "
        "nothing with --refit)",
    )
    p.add_argument(
        "--path-profile-out",
        default=None,
        metavar="FILE",
        help="write the path profile here (default: beside --out, *.paths.json)",
    )
    p.add_argument(
        "--refit", default=None, metavar="FILE", help="fit again from the raw measurements in FILE"
    )
    p.add_argument("--name", default=None, help="the model's name (default: profiled-BACKEND)")
    p.add_argument(
        "--tolerance",
        type=float,
        default=None,
        help="relative loss below which a class counts as lossless (default 0.02)",
    )
    g = p.add_argument_group("measurement")
    g.add_argument(
        "--nbytes",
        type=parse_size,
        default=64 << 20,
        help="bytes per bandwidth experiment, all flows together (default 64MiB)",
    )
    g.add_argument("--repeats", type=int, default=1, help="runs per experiment (median; default 1)")
    g.add_argument(
        "--probe-bytes",
        type=parse_size,
        default=256,
        help="bytes of each per-message probe transfer (default 256)",
    )
    g.add_argument("--posts", type=int, default=8, help="transfers per cost probe (default 8)")
    g.add_argument(
        "--topology",
        default=None,
        metavar="SOURCE",
        help="the node whose GPUs the posted-write trigger probe measures: a preset, 'sysfs' or "
        "a file (emulated: the fabric added to the emulated machine; cuda: its GPUs must be "
        "this process's devices in order); without it the trigger factor is left unset",
    )
    g.add_argument(
        "--trigger-situations",
        type=int,
        default=24,
        metavar="N",
        help="most situations (uplink, two other root complexes) the trigger probe measures "
        "(default 24; 0: none)",
    )
    e = p.add_argument_group("emulated backend")
    e.add_argument(
        "--inject",
        default="pcie",
        metavar="MODEL",
        help="the network model the emulated machine runs: pcie, none or a JSON file (default pcie)",
    )
    e.add_argument(
        "--jitter", type=float, default=0.0, help="per-experiment link jitter, ±fraction"
    )
    e.add_argument("--seed", type=int, default=0, help="seed of the jitter (default 0)")
    e.add_argument(
        "--inject-trigger",
        type=float,
        default=None,
        metavar="F",
        help="the posted-write trigger factor the emulated fabric runs (1: none; default: the "
        "injected model's on --topology)",
    )
    c = p.add_argument_group("cuda backend")
    c.add_argument(
        "--pair",
        action="append",
        default=[],
        metavar="CLASS=SRC,DST",
        help="devices of a path class (PIX PXB PHB NODE SYS SHM), e.g. PHB=0,4; repeatable",
    )
    c.add_argument(
        "--dma-device", type=int, default=0, help="device of the host-memory copies (default 0)"
    )


def _pairs(specs: list[str]) -> dict[str, tuple[int, int]]:
    pairs = {}
    for spec in specs:
        m = re.fullmatch(r"\s*([A-Z]+)\s*=\s*(\d+)\s*,\s*(\d+)\s*", spec)
        if not m:
            raise VarioPathError(f"--pair {spec!r}: expected CLASS=SRC,DST such as PHB=0,4")
        pairs[m.group(1)] = (int(m.group(2)), int(m.group(3)))
    if not pairs:
        raise VarioPathError(
            "--backend cuda needs --pair CLASS=SRC,DST for each path class to measure "
            "(`nvidia-smi topo -m` shows the class of each pair)"
        )
    return pairs


def _backend(args: argparse.Namespace) -> Any:
    from variopath_jax.profile import CudaBackend, EmulatedBackend, Injected
    from variopath_jax.sim import load_network
    from variopath_jax.topology import load_topology

    topo = None if args.topology is None else load_topology(args.topology)
    if topo is not None:
        check_sizes(args, topo)
    if args.backend == "cuda":
        return CudaBackend(_pairs(args.pair), dma_device=args.dma_device, topology=topo)
    if not 0 <= args.jitter < 1:
        raise VarioPathError(f"--jitter {args.jitter}: need a fraction in [0, 1)")
    changes: dict[str, Any] = {"jitter": args.jitter, "seed": args.seed}
    if args.inject_trigger is not None:
        if not 0 < args.inject_trigger <= 1:
            raise VarioPathError(f"--inject-trigger {args.inject_trigger}: need a factor in (0, 1]")
        changes["trigger_factor"] = args.inject_trigger
    injected = Injected.from_network(load_network(args.inject), topo, **changes)
    return EmulatedBackend(injected, topo)


def cmd_profile(args: argparse.Namespace) -> dict[str, Any]:
    from variopath_jax.profile import TOLERANCE, Plan, fit, measure, report

    tolerance = TOLERANCE if args.tolerance is None else args.tolerance
    if args.refit:
        raw = report.read_raw(args.refit)
        out = Path(args.out) if args.out else None
    else:
        plan = Plan(
            nbytes=args.nbytes,
            repeats=args.repeats,
            probe_bytes=args.probe_bytes,
            posts=args.posts,
            trigger_situations=args.trigger_situations,
        )
        with progress.task("profile", total=None) as task:
            raw = report.stamp(
                measure(_backend(args), plan, progress=lambda msg: task.advance(0, label=msg))
            )
        out = Path(args.out or "profile-network.json")
    name = args.name or f"profiled-{raw['machine'].get('backend', 'machine')}"
    fitted = fit(raw, tolerance)
    doc = report.network_document(raw, fitted, name)
    paths = report.path_profile_document(raw, fitted)
    paths_out = None
    if out is not None:
        paths_out = Path(args.path_profile_out or out.with_name(out.stem + ".paths.json"))
        report.write(doc, paths, out, paths_out)
    return report.summary(doc, out and str(out), paths_out and str(paths_out))


def human(out: dict[str, Any]) -> None:
    from variopath_jax.profile.report import human as print_summary

    print_summary(out)
