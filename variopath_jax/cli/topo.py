"""``variopath topo show|convert``: inspect and convert topologies.

``show`` gives the whole deployment's relation matrices up to ``FULL_RANKS`` ranks and a summary
past it (node 0's matrices, which every node shares, and totals whose cost does not grow with the
node count); ``--full`` asks for the whole matrices up to ``MAX_FULL_RANKS`` ranks and is refused
beyond, ``--summary`` asks for the summary at any size."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

from variopath_jax.cli.common import command, console, load_from_args, topology_args
from variopath_jax.cli.limits import check_sizes
from variopath_jax.errors import VarioPathError
from variopath_jax.topology import PathModel, Topology, nvsmi, spec

DETECT_OUT = "my-node.json"
FULL_RANKS = 128  # whole matrices by default up to this many ranks (16,384 GPU pairs)
MAX_FULL_RANKS = 1024  # ... and on request up to this many (about 10 MB of JSON)


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``topo show`` and ``topo convert``."""
    topo = sub.add_parser("topo", help="inspect and convert topologies")
    topo_sub = topo.add_subparsers(dest="topo_command", required=True)
    show = command(
        topo_sub, "show", cmd_topo_show, "show a topology: classes, groups, candidate paths", human
    )
    topology_args(show)
    scope = show.add_mutually_exclusive_group()
    scope.add_argument(
        "--summary",
        action="store_true",
        help="node 0's matrices and totals only (the default past "
        f"{FULL_RANKS} ranks; every node is identical)",
    )
    scope.add_argument(
        "--full",
        action="store_true",
        help=f"the whole deployment's relation matrices and groups (up to {MAX_FULL_RANKS} ranks)",
    )
    conv = command(
        topo_sub,
        "convert",
        cmd_topo_convert,
        "convert a topology to a spec file or topo -m text",
        human_convert,
    )
    topology_args(conv)
    conv.add_argument("--to", choices=("spec", "nvsmi"), required=True)
    conv.add_argument("-o", "--output", default=None, help="write here instead of stdout")
    det = command(
        topo_sub,
        "detect",
        cmd_topo_detect,
        "write a spec of this machine: sysfs, with the link generation and GPU P2P read or "
        "probed (CUDA, nvidia-smi), never assumed",
        human_detect,
    )
    det.add_argument(
        "-o", "--output", default=DETECT_OUT, help=f"the spec file to write (default {DETECT_OUT})"
    )
    det.add_argument("--nodes", type=int, default=None, help="the deployment: K nodes like this")
    det.add_argument(
        "--pcie-gen",
        type=int,
        default=None,
        help="the PCIe generation of links sysfs gives no speed for (default: nvidia-smi's)",
    )
    det.add_argument(
        "--p2p",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="state GPU peer-to-peer instead of probing it",
    )
    det.add_argument(
        "--gdr",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="state GPUDirect RDMA instead of reading it (the nvidia_peermem module)",
    )
    det.add_argument("--sys-root", default="/sys", help=argparse.SUPPRESS)  # tests: a fake /sys


def whole(topo: Topology, summary: bool, full: bool) -> bool:
    """Whether ``topo show`` gives the whole deployment's matrices; refuses ``full`` past
    ``MAX_FULL_RANKS`` ranks."""
    n = topo.num_ranks
    if full and n > MAX_FULL_RANKS:
        raise VarioPathError(
            f"{topo.name} x {topo.nodes} has {n:,} ranks: its whole relation matrices would hold "
            f"{n * n:,} GPU pairs, past the {MAX_FULL_RANKS:,}-rank limit of --full; "
            "--summary (the default at this size) gives node 0's matrices, which every node "
            "shares (NET between nodes), and the totals"
        )
    return full or (not summary and n <= FULL_RANKS)


def cmd_topo_show(args: argparse.Namespace) -> dict[str, Any]:
    notes: list[str] = []
    topo = load_from_args(args, notes=notes)
    full = whole(topo, args.summary, args.full)
    model = PathModel(topo, nic_policy=args.nic_policy)
    node = topo.node
    per_node = topo.gpus_per_node
    node_topo = topo.with_nodes(1)
    out: dict[str, Any] = {
        "name": topo.name,
        "fingerprint": topo.fingerprint,
        "nodes": topo.nodes,
        "gpus": topo.num_ranks,
        "nics": topo.nodes * topo.nics_per_node,
        "switches": topo.nodes * len(node.of_kind("switch")),
        "sockets": topo.nodes * len(node.of_kind("cpu")),
        "p2p": topo.p2p,
        "gdr": topo.gdr,
        "oversubscription": topo.oversubscription,
        "links": len(topo.graph.links),
        "group_size": model.group_size,
        "group_count": len(model.groups),
        "summary": not full,
        "node_groups": [list(g) for g in model.groups[: model.groups_per_node]],
        "node_relations": node_topo.relations(),
        "node_nic_relations": node_topo.nic_relations(),
        "nic_names": [d.label or d.name for d in node.nics],
        "paths": model.class_counts(),
        "notes": notes,
    }
    if full:
        out["groups"] = [list(g) for g in model.groups]
        out["relations"] = topo.relations()
        out["nic_relations"] = topo.nic_relations()
    else:
        notes.append(
            f"summary of {topo.num_ranks:,} ranks: node_relations and node_groups are node 0's "
            f"(ranks 0-{per_node - 1}); every node is identical and GPUs on different nodes are "
            "NET; --full gives the whole matrices"
            + ("" if topo.num_ranks <= MAX_FULL_RANKS else f" up to {MAX_FULL_RANKS:,} ranks")
        )
    return out


def matrix_lines(
    rows: list[str], columns: list[str], cells: list[list[str]], width: int
) -> list[str]:
    """``nvidia-smi topo -m``-style text of a relation matrix, its columns split into blocks that
    fit ``width`` characters (each block repeats the row names)."""
    label = max(len(r) for r in rows) + 2
    col = max(len(c) for c in [*columns, *(x for row in cells for x in row)]) + 2
    per_block = max(1, (width - label) // col)
    lines: list[str] = []
    for start in range(0, len(columns), per_block):
        block = range(start, min(start + per_block, len(columns)))
        if lines:
            lines.append("")
        lines.append(" " * label + "".join(columns[j].ljust(col) for j in block).rstrip())
        for i, name in enumerate(rows):
            lines.append(
                name.ljust(label) + "".join(cells[i][j].ljust(col) for j in block).rstrip()
            )
    return lines


def human(out: dict[str, Any]) -> None:
    out_console = console()
    out_console.print(
        f"[bold]{out['name']}[/bold]  fingerprint {out['fingerprint']}  "
        f"{out['nodes']} node(s), {out['gpus']} GPUs, {out['nics']} NICs, {out['switches']} "
        f"switches, p2p={out['p2p']} gdr={out['gdr']}",
        highlight=False,
    )
    per_node = len(out["node_relations"])
    nics = len(out["node_nic_relations"][0]) if out["node_nic_relations"] else 0
    columns = [f"GPU{j}" for j in range(per_node)] + [f"NIC{k}" for k in range(nics)]
    rows = [f"GPU{i}" for i in range(per_node)]
    cells = [out["node_relations"][i] + out["node_nic_relations"][i] for i in range(per_node)]
    title = "node 0: nvidia-smi topo -m classes" + (
        "" if out["nodes"] == 1 else " (NET between nodes)"
    )
    out_console.print(title, highlight=False)
    for line in matrix_lines(rows, columns, cells, out_console.width):
        out_console.print(line, highlight=False, soft_wrap=True)
    if any(not re.fullmatch(r"(?i)nic\d+", name) for name in out["nic_names"]):
        names = ", ".join(f"NIC{k}: {n}" for k, n in enumerate(out["nic_names"]))
        out_console.print(f"NICs: {names}", highlight=False)
    groups = out.get("groups", out["node_groups"])
    more = "" if "groups" in out else f" (node 0's; {out['group_count']:,} in all)"
    out_console.print(f"rank groups (size {out['group_size']}){more}: {groups}", highlight=False)
    out_console.print(
        "candidate paths per class: " + ", ".join(f"{k} {v:,}" for k, v in out["paths"].items()),
        highlight=False,
    )
    for note in out["notes"]:
        out_console.print(f"note: {note}", highlight=False)


def cmd_topo_convert(args: argparse.Namespace) -> dict[str, Any]:
    topo = load_from_args(args)
    text = spec.dumps(topo) if args.to == "spec" else nvsmi.render(topo)
    result: dict[str, Any] = {
        "format": args.to,
        "fingerprint": topo.fingerprint,
        "output": args.output,
        "topology": topo.name,
    }
    if args.output:
        Path(args.output).write_text(text)
        result["bytes"] = len(text.encode())
    else:
        result["text"] = text
    return result


def human_convert(out: dict[str, Any]) -> None:
    if out["output"] is None:
        print(out["text"], end="")
        return
    what = "a topology spec (JSON)" if out["format"] == "spec" else "nvidia-smi topo -m text"
    print(
        f"wrote {out['output']}: {what} of {out['topology']}, fingerprint {out['fingerprint']}, "
        f"{out['bytes']:,} bytes"
    )


def cmd_topo_detect(args: argparse.Namespace) -> dict[str, Any]:
    from variopath_jax.topology.detect import detect

    found = detect(
        args.sys_root, nodes=args.nodes or 1, pcie_gen=args.pcie_gen, p2p=args.p2p, gdr=args.gdr
    )
    topo = found.topology
    check_sizes(args, topo)
    Path(args.output).write_text(spec.dumps(topo))
    node = topo.node
    return {
        "output": args.output,
        "topology": topo.name,
        "fingerprint": topo.fingerprint,
        "nodes": topo.nodes,
        "gpus": topo.gpus_per_node,
        "nics": topo.nics_per_node,
        "switches": sum(d.kind == "switch" for d in node.devices),
        "sockets": sum(d.kind == "cpu" for d in node.devices),
        "gpu_link_gbs": sorted({d.up_gbs for d in node.gpus}),
        "p2p": topo.p2p,
        "gdr": topo.gdr,
        "sources": {"links": found.links, "p2p": found.p2p, "gdr": found.gdr},
        "notes": list(found.notes),
    }


def human_detect(out: dict[str, Any]) -> None:
    src = out["sources"]
    rates = ", ".join(f"{g:g}" for g in out["gpu_link_gbs"])
    print(
        f"wrote {out['output']}: {out['topology']} x {out['nodes']}, {out['gpus']} GPUs, "
        f"{out['nics']} NICs, {out['switches']} PCIe switches, {out['sockets']} socket(s); "
        f"fingerprint {out['fingerprint']}"
    )
    print(f"  GPU links {rates} GB/s per direction, from {src['links']}")
    print(f"  GPU peer-to-peer {'on' if out['p2p'] else 'off'}, from {src['p2p']}")
    print(f"  GPUDirect RDMA {'on' if out['gdr'] else 'off'}: {src['gdr']}")
    for note in out["notes"]:
        print(f"  note: {note}")
    print(f"use it: variopath_jax.configure({out['output']!r}), or --topology {out['output']}")
