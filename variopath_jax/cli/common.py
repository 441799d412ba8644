"""What the command modules share: the registrar, sizes, topology / workload / planner / network
options and their loaders, and the console that prints tables."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from variopath_jax import workloads
from variopath_jax.baselines.nccl import P2P_LEVELS
from variopath_jax.cli.limits import check_sizes
from variopath_jax.errors import VarioPathError
from variopath_jax.sim import DEFAULT_COALESCE, NetworkModel, load_network
from variopath_jax.topology import LinkDefaults, PathModel, Topology, load_topology
from variopath_jax.topology.paths import NIC_POLICIES, load_path_profile

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

Handler = Callable[[argparse.Namespace], dict[str, Any]]
Human = Callable[[dict[str, Any]], None]

# unit (lower case) -> bytes; the order is the order the error message names them in
_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "pb": 10**15,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "tib": 1 << 40,
    "pib": 1 << 50,
}
_UNIT_NAMES = "B, KB, MB, GB, TB, PB (powers of 1000) and KiB, MiB, GiB, TiB, PiB (powers of 1024)"


def parse_size(text: str) -> int:
    """Bytes from ``4096``, ``32KiB``, ``1.5MiB``, ``2GB`` (unit case ignored)."""
    s = text.strip().lower().replace(" ", "")
    num = s.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = s[len(num) :]
    try:
        value = float(num) * _UNITS[unit]
    except (KeyError, ValueError):
        raise argparse.ArgumentTypeError(
            f"not a size: {text!r}; a number with an optional unit, one of {_UNIT_NAMES} "
            "(examples: 4096, 32KiB, 1.5MiB, 2GB)"
        ) from None
    if value == float("inf"):
        raise argparse.ArgumentTypeError(f"not a finite number of bytes: {text!r}")
    if not value >= 0 or value != int(value):
        raise argparse.ArgumentTypeError(f"not a whole, non-negative number of bytes: {text!r}")
    return int(value)


def command(
    subparsers: argparse._SubParsersAction,
    name: str,
    handler: Handler,
    help: str,
    human: Human | None = None,
) -> argparse.ArgumentParser:
    """Add a subcommand with the options every command has (``--json``, ``--progress``)."""
    p = subparsers.add_parser(name, help=help, description=help)
    p.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="report long work on stderr (default: when stderr is a terminal and --json is off)",
    )
    p.set_defaults(handler=handler, human=human)
    return p


# ----- topology ----------------------------------------------------------------------------
def topology_args(p: argparse.ArgumentParser) -> None:
    """A positional topology source and the options that complete it."""
    p.add_argument(
        "source", help="preset name, 'sysfs', or a file (spec JSON, NCCL XML, nvidia-smi topo -m)"
    )
    topology_options(p)


def topology_options(p: argparse.ArgumentParser) -> None:
    """Node count, format and the link speeds a source may lack."""
    d = LinkDefaults()
    p.add_argument("--nodes", type=int, default=None, help="replicate to K identical nodes")
    p.add_argument("--format", dest="fmt", default=None, help="force the source format")
    p.add_argument(
        "--pcie-gen",
        type=int,
        default=None,
        help=f"PCIe generation when the source has none (nvidia-smi text without its query "
        f"block: else Gen{d.pcie_gen} is assumed, and the topology says so)",
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


def load_from_args(
    args: argparse.Namespace, source: str | None = None, notes: list[str] | None = None
) -> Topology:
    """The topology the options name; ``notes`` collects what the source left to assumption."""
    defaults = LinkDefaults(
        pcie_gen=LinkDefaults().pcie_gen if args.pcie_gen is None else args.pcie_gen,
        pcie_width=args.pcie_width,
        nic_gbps=args.nic_gbps,
        inter_socket_gbs=args.inter_socket_gbs,
    )
    topo = load_topology(
        source or args.source,
        args.nodes,
        fmt=args.fmt,
        defaults=defaults,
        p2p=args.p2p,
        gdr=args.gdr,
        notes=notes,
        pcie_gen=args.pcie_gen,
    )
    check_sizes(args, topo)  # before anything grows with the deployment
    return topo


def path_profile_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--path-profile",
        default=None,
        metavar="FILE",
        help="plan with measured or hand-set path rates: a JSON path profile "
        "(per-class efficiency and GB/s caps; docs/topology.md 'Path profiles')",
    )


def path_model_from_args(args: argparse.Namespace, topo: Topology) -> PathModel:
    """The path model a command plans with: the topology's paths under ``--nic-policy``, rated
    by ``--path-profile`` when one is given."""
    profile = getattr(args, "path_profile", None)
    if profile is None:
        return PathModel(topo, nic_policy=args.nic_policy)
    return load_path_profile(profile).model(topo, nic_policy=args.nic_policy)


# ----- workload ----------------------------------------------------------------------------
def workload_options(p: argparse.ArgumentParser) -> None:
    """A generated (``--workload``) or loaded (``--demand``) demand and its parameters."""
    g = p.add_argument_group("workload")
    src = g.add_mutually_exclusive_group(required=True)
    src.add_argument("--workload", choices=sorted(workloads.WORKLOADS), help="generate a demand")
    src.add_argument("--demand", help="load a demand matrix (.npy or CSV)")
    g.add_argument(
        "--drop-self",
        action="store_true",
        help="zero a loaded matrix's diagonal (self traffic is local)",
    )
    g.add_argument(
        "--bytes-per-pair",
        type=parse_size,
        default=1 << 20,
        help="uniform: bytes per pair (default 1MiB)",
    )
    g.add_argument("--tokens", type=int, default=128, help="moe: tokens per rank M (default 128)")
    g.add_argument("--experts", type=int, default=256, help="moe: experts (default 256)")
    g.add_argument("--top-k", type=int, default=8, help="moe: experts per token (default 8)")
    g.add_argument("--hidden", type=int, default=7168, help="moe: hidden size (default 7168)")
    g.add_argument(
        "--dtype-bytes", type=int, default=2, help="moe/sp: bytes per element (default 2, bf16)"
    )
    g.add_argument("--skew", type=float, default=0.6, help="zipf: skewness s (default 0.6)")
    g.add_argument(
        "--bytes-per-rank",
        type=parse_size,
        default=32 << 20,
        help="zipf: mean bytes per rank (default 32MiB)",
    )
    g.add_argument(
        "--heads-parallel", type=int, default=None, help="sp: H (default: GPUs per node)"
    )
    g.add_argument("--seq-len", type=int, default=75600, help="sp: sequence length (default 75600)")
    g.add_argument("--num-heads", type=int, default=40, help="sp: attention heads (default 40)")
    g.add_argument("--head-dim", type=int, default=128, help="sp: head dimension (default 128)")


def make_demand(args: argparse.Namespace, topo: Topology) -> tuple[np.ndarray, dict[str, Any]]:
    """The demand the workload options describe, and the JSON fields that name it."""
    n = topo.num_ranks
    if args.demand:
        return workloads.load_demand(args.demand, n, args.drop_self), {"demand": args.demand}
    name = args.workload
    if name == "uniform":
        return workloads.uniform(n, args.bytes_per_pair), {
            "workload": name,
            "bytes_per_pair": args.bytes_per_pair,
        }
    if name == "moe":
        d = workloads.moe(
            n,
            args.tokens,
            experts=args.experts,
            top_k=args.top_k,
            hidden=args.hidden,
            dtype_bytes=args.dtype_bytes,
            seed=args.seed,
        )
        return d, {
            "workload": name,
            "tokens": args.tokens,
            "experts": args.experts,
            "top_k": args.top_k,
        }
    if name == "zipf":
        d = workloads.zipf(n, args.skew, args.bytes_per_rank, seed=args.seed)
        return d, {"workload": name, "skew": args.skew, "bytes_per_rank": args.bytes_per_rank}
    h = args.heads_parallel or topo.gpus_per_node
    if n % h:
        raise workloads.DemandError(f"sp: H={h} does not divide {n} ranks")
    d = workloads.sp(
        h,
        n // h,
        seq_len=args.seq_len,
        num_heads=args.num_heads,
        head_dim=args.head_dim,
        dtype_bytes=args.dtype_bytes,
    )
    return d, {"workload": name, "heads_parallel": h, "context_parallel": n // h}


# ----- planner, network, simulator ---------------------------------------------------------
def planner_options(p: argparse.ArgumentParser) -> None:
    """VarioPath's planner parameters and the peers' options."""
    g = p.add_argument_group("VarioPath planner")
    g.add_argument(
        "--k-target",
        type=int,
        default=None,
        help="target rounds K (default N; the paper uses N..3N)",
    )
    g.add_argument(
        "--starts", type=int, default=4, help="Alternating Algorithm starts N_start (default 4)"
    )
    g.add_argument(
        "--sweeps", type=int, default=3, help="Alternating Algorithm sweeps I_AA (default 3)"
    )
    g.add_argument(
        "--granularity",
        choices=("auto", "fixed"),
        default="auto",
        help="auto: fewer rounds when λ dominates (default); fixed: exactly K_target's quantum",
    )
    g.add_argument(
        "--planner",
        choices=("cpp", "python"),
        default="cpp",
        help="Algorithm 2 (variopath-paper, variopath-fixed-path): C++ core or Python reference",
    )
    peers = p.add_argument_group("peer schedulers")
    peers.add_argument(
        "--nccl-p2p-level",
        type=str.upper,
        choices=P2P_LEVELS,
        default=None,
        help="nccl: NCCL_P2P_LEVEL, the farthest path class that uses P2P "
        "(default NCCL's own rule, PXB; beyond it, host memory)",
    )


def planner_dict(args: argparse.Namespace) -> dict[str, Any]:
    """The scheduler options (``PlanRequest.options``) the planner options give."""
    return {
        "k_target": args.k_target,
        "starts": args.starts,
        "sweeps": args.sweeps,
        "granularity": args.granularity,
        "planner": args.planner,
        "nccl_p2p_level": args.nccl_p2p_level,
    }


def model_options(p: argparse.ArgumentParser) -> None:
    """The seed and the network model."""
    p.add_argument("--seed", type=int, default=0, help="seed of the workload and the planner")
    network_options(p)


def network_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--contention",
        default="pcie",
        help="network model: pcie (calibrated contention with the posted-write trigger: an "
        "uplink writing to two or more root complexes at once collapses; the default), "
        "pcie-fair (the same without the trigger), none (ideal sharing) or a JSON file of "
        "measured parameters (docs/simulator.md)",
    )
    p.add_argument(
        "--lambda-us",
        type=float,
        default=None,
        help="barrier cost λ in µs, planned with and charged (default: the network model's)",
    )


def plan_for_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--plan-for",
        default=None,
        help="the network model(s) model-aware schedulers plan for, names and JSON files "
        "separated by commas (several: the plan of least regret over them, e.g. "
        "pcie,pcie-fair,none); default: the --contention model",
    )


def network_from_args(args: argparse.Namespace) -> NetworkModel:
    """The network model named by ``--contention``, with ``--lambda-us`` applied."""
    network = load_network(args.contention)
    if args.lambda_us is not None:
        if not args.lambda_us >= 0:
            raise VarioPathError(f"--lambda-us must be >= 0, got {args.lambda_us}")
        network = network.replace(barrier_s=args.lambda_us * 1e-6)
    return network


def network_summary(network: NetworkModel) -> dict[str, Any]:
    """The JSON fields that name a network model."""
    return {"contention": network.name, "lambda_us": network.barrier_s * 1e6}


def sim_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--coalesce",
        type=float,
        default=DEFAULT_COALESCE,
        help=f"simulator event-coalescing tolerance ε (default {DEFAULT_COALESCE:g}; 0 = exact)",
    )


# ----- output ------------------------------------------------------------------------------
# Width tables render at when stdout is not a terminal: a file has no width, so nothing is cut.
PIPE_WIDTH = 500


def console(max_width: int | None = None) -> Console:
    """A rich console on stdout: the terminal's width, or wide enough for any table when
    stdout is a pipe or a file; at most ``max_width`` columns when given (``print_table`` splits
    a wider table's columns over several tables)."""
    from rich.console import Console

    out = Console()
    width = out.width if out.is_terminal else PIPE_WIDTH
    if max_width is not None and width > max_width:
        return Console(width=max_width)
    return out if out.is_terminal else Console(width=PIPE_WIDTH)


def _table(columns: list[tuple[str, str]], rows: list[list[str]]) -> Table:
    """A compact table: no outer box, one space each side of a column, nothing wrapped."""
    from rich import box
    from rich.table import Table

    t = Table(box=box.SIMPLE_HEAD, show_edge=False, padding=(0, 1), pad_edge=False)
    for header, justify in columns:
        t.add_column(header, justify=justify, no_wrap=True)
    for row in rows:
        t.add_row(*row)
    return t


def print_table(
    out_console: Console,
    columns: list[tuple[str, str]],
    rows: list[list[str]],
    *,
    title: str | None = None,
    caption: str | None = None,
    keys: int = 1,
) -> None:
    """Print ``title``, ``rows`` under ``columns`` ((header, justify) pairs) as a compact table,
    and ``caption``. When the table is wider than the console, the columns after the first
    ``keys`` (what tells rows apart) are split over several tables that fit, each repeating the
    key columns; nothing is cut."""
    from rich.measure import Measurement

    def table_of(cols: list[int]) -> Table:
        return _table([columns[c] for c in cols], [[r[c] for c in cols] for r in rows])

    def width(cols: list[int]) -> int:
        unbounded = out_console.options.update_width(10_000)
        return Measurement.get(out_console, unbounded, table_of(cols)).maximum

    key_cols = list(range(keys))
    groups: list[list[int]] = [[]]
    for c in range(keys, len(columns)):
        if groups[-1] and width(key_cols + groups[-1] + [c]) > out_console.width:
            groups.append([])
        groups[-1].append(c)
    if title:
        out_console.print(title, highlight=False)
    for group in groups:
        out_console.print(table_of(key_cols + group))
    if caption:
        out_console.print(caption, highlight=False, style="dim")
