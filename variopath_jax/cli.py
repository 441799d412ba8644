"""The ``variopath`` command line. Every command takes ``--json`` and then prints exactly one JSON
document on stdout (human-readable tables otherwise); errors go to stderr with exit status 2."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from variopath_jax.errors import VarioPathError
from variopath_jax.topology import LinkDefaults, PathModel, Topology, load_topology, nvsmi, spec
from variopath_jax.topology.paths import NIC_POLICIES

Handler = Callable[[argparse.Namespace], dict[str, Any]]


def _topology_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "source", help="preset name, 'sysfs', or a file (spec JSON, NCCL XML, nvidia-smi topo -m)"
    )
    _topology_options(p)


def _topology_options(p: argparse.ArgumentParser) -> None:
    d = LinkDefaults()
    p.add_argument("--nodes", type=int, default=None, help="replicate to K identical nodes")
    p.add_argument("--format", dest="fmt", default=None, help="force the source format")
    p.add_argument(
        "--pcie-gen",
        type=int,
        default=d.pcie_gen,
        help=f"PCIe generation when the source has none (default {d.pcie_gen})",
    )
    p.add_argument(
        "--pcie-width",
        type=int,
        default=d.pcie_width,
        help=f"PCIe link width (default x{d.pcie_width})",
    )
    p.add_argument(
        "--nic-gbps",
        type=float,
        default=d.nic_gbps,
        help=f"NIC line rate in Gb/s (default {d.nic_gbps:g})",
    )
    p.add_argument(
        "--inter-socket-gbs",
        type=float,
        default=d.inter_socket_gbs,
        help=f"inter-socket link, GB/s per direction (default {d.inter_socket_gbs:g})",
    )
    p.add_argument(
        "--p2p",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="override GPU peer-to-peer",
    )
    p.add_argument(
        "--gdr", action=argparse.BooleanOptionalAction, default=None, help="override GPUDirect RDMA"
    )
    p.add_argument(
        "--nic-policy", choices=NIC_POLICIES, default="nearest", help="which NICs a GPU may use"
    )


def load_from_args(args: argparse.Namespace, source: str | None = None) -> Topology:
    defaults = LinkDefaults(
        pcie_gen=args.pcie_gen,
        pcie_width=args.pcie_width,
        nic_gbps=args.nic_gbps,
        inter_socket_gbs=args.inter_socket_gbs,
    )
    return load_topology(
        source or args.source,
        args.nodes,
        fmt=args.fmt,
        defaults=defaults,
        p2p=args.p2p,
        gdr=args.gdr,
    )


# ----- topo --------------------------------------------------------------------------------
def cmd_topo_show(args: argparse.Namespace) -> dict[str, Any]:
    topo = load_from_args(args)
    model = PathModel(topo, nic_policy=args.nic_policy)
    node = topo.node
    return {
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
        "groups": [list(g) for g in model.groups],
        "group_size": model.group_size,
        "relations": topo.relations(),
        "nic_relations": topo.nic_relations(),
        "paths": model.class_counts(),
    }


def _human_topo_show(out: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    console.print(
        f"[bold]{out['name']}[/bold]  fingerprint {out['fingerprint']}  "
        f"{out['nodes']} node(s), {out['gpus']} GPUs, {out['nics']} NICs, {out['switches']} switches, "
        f"p2p={out['p2p']} gdr={out['gdr']}"
    )
    per_node = out["gpus"] // out["nodes"]
    nics_per_node = out["nics"] // out["nodes"]
    table = Table(title="node 0: nvidia-smi topo -m classes")
    table.add_column("")
    for j in range(per_node):
        table.add_column(f"GPU{j}")
    for k in range(nics_per_node):
        table.add_column(f"NIC{k}")
    for i in range(per_node):
        table.add_row(
            f"GPU{i}", *out["relations"][i][:per_node], *out["nic_relations"][i][:nics_per_node]
        )
    console.print(table)
    console.print(f"rank groups (size {out['group_size']}): {out['groups']}")
    console.print(
        "candidate paths per class: " + ", ".join(f"{k} {v}" for k, v in out["paths"].items())
    )


def cmd_topo_convert(args: argparse.Namespace) -> dict[str, Any]:
    topo = load_from_args(args)
    text = spec.dumps(topo) if args.to == "spec" else nvsmi.render(topo)
    if args.output:
        Path(args.output).write_text(text)
    elif not args.json:
        sys.stdout.write(text)
    result: dict[str, Any] = {
        "format": args.to,
        "fingerprint": topo.fingerprint,
        "output": args.output,
    }
    if not args.output:
        result["text"] = text
    return result


def cmd_info(args: argparse.Namespace) -> dict[str, Any]:
    from variopath_jax import __version__
    from variopath_jax._native import build_info, cuda_devices

    info: dict[str, Any] = {"version": __version__, "native": build_info(), "cuda": cuda_devices()}
    info["native"]["ffi_api_version"] = list(info["native"]["ffi_api_version"])
    try:
        import jax

        info["jax"] = jax.__version__
    except ImportError:  # pragma: no cover - jax is a dependency
        info["jax"] = None
    return info


def _human_info(out: dict[str, Any]) -> None:
    native, cuda = out["native"], out["cuda"]
    print(f"variopath_jax {out['version']}  (jax {out['jax']})")
    print(
        f"native module: {native['compiler']}, C++ {native['cxx_standard']}, FFI API {native['ffi_api_version']}"
    )
    if cuda["compiled"]:
        print(
            f"CUDA parts: built with nvcc {native['cuda_compiler_version']}; devices: {cuda['device_count']}"
            + (f" ({cuda['error']})" if cuda["error"] else "")
        )
    else:
        print(f"CUDA parts: not built ({cuda['error']})")


# ----- parser ------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="variopath", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    def command(
        subparsers, name: str, handler: Handler, help: str, human=None
    ) -> argparse.ArgumentParser:
        p = subparsers.add_parser(name, help=help, description=help)
        p.add_argument("--json", action="store_true", help="print one JSON document on stdout")
        p.set_defaults(handler=handler, human=human)
        return p

    topo = sub.add_parser("topo", help="inspect and convert topologies")
    topo_sub = topo.add_subparsers(dest="topo_command", required=True)
    show = command(
        topo_sub,
        "show",
        cmd_topo_show,
        "show a topology: classes, groups, candidate paths",
        _human_topo_show,
    )
    _topology_args(show)
    conv = command(
        topo_sub, "convert", cmd_topo_convert, "convert a topology to a spec file or topo -m text"
    )
    _topology_args(conv)
    conv.add_argument("--to", choices=("spec", "nvsmi"), required=True)
    conv.add_argument("-o", "--output", default=None, help="write here instead of stdout")

    command(sub, "info", cmd_info, "versions, native build and CUDA devices", _human_info)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        out = args.handler(args)
    except VarioPathError as err:
        if args.json:
            print(json.dumps({"error": str(err)}))
        print(f"variopath: error: {err}", file=sys.stderr)
        return 2
    if args.json:
        json.dump(out, sys.stdout)
        sys.stdout.write("\n")
    elif args.human is not None:
        args.human(out)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
