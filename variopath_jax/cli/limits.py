"""The sizes every command can handle, and the one check that refuses the others at once.

``check_sizes(args)`` runs in ``main`` before any command starts (what the options alone
decide: a node count past every limit, byte sizes, seeds, repeats) and ``check_sizes(args,
topo)`` again as soon as a command has loaded its topology (cheap at any node count: a topology
is one node and a count), before anything grows with the deployment (path models, demands,
catalogs, solver models). Each refusal names the option, the limit and what works instead."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import TYPE_CHECKING

from variopath_jax.errors import VarioPathError

if TYPE_CHECKING:
    from variopath_jax.topology import Topology

# The topology commands (topo, catalog, profile --topology): the path model holds every rank
# group pair's candidate paths; at 16,384 ranks (2,048 nodes of 8 GPUs) it takes about 0.5 s,
# and it grows with the number of nodes.
MAX_TOPOLOGY_RANKS = 16_384
# gap: the oracles' MILPs grow with the N×N demand entries times the links; the paper's study
# (Figure 12) runs 8 and 16 ranks, and one size and seed at 32 ranks took over 5 minutes with
# 5-s solves.
MAX_GAP_RANKS = 32
# Bytes a rank sends in one call: 1 TiB, past any GPU's memory (and every demand's total stays
# exact in a double, which the simulator and the LP use).
MAX_BYTES_PER_RANK = 1 << 40
# The MoE generator draws one random key per (rank, token, expert): 2^30 draws take about 15 s.
MAX_MOE_DRAWS = 1 << 30
MAX_SEEDS = 1000  # demands per point (bench, gap): each seed re-runs every point
MAX_REPEATS = 1000  # profile: runs per experiment
MAX_POSTS = 100_000  # profile: transfers per cost probe
MAX_TRIGGER_SITUATIONS = 10_000  # profile: situations of the trigger probe


@dataclass(frozen=True)
class RankLimit:
    ranks: int
    why: str  # what grows with the ranks
    instead: str  # what works at any size


def _runner_limit() -> RankLimit:
    from variopath_jax import runner

    return RankLimit(
        runner.MAX_RANKS,
        "a run holds the N×N demand matrix and plans, validates and simulates every GPU pair",
        "`variopath topo show --summary` describes the deployment and `variopath catalog build` "
        "builds its factored catalog, whose cost does not grow with the node count",
    )


def rank_limit(command: str) -> RankLimit:
    """The most ranks ``variopath COMMAND`` handles, and why."""
    if command in ("run", "plan", "simulate"):
        return _runner_limit()
    if command == "gap":
        return RankLimit(
            MAX_GAP_RANKS,
            "the oracles' MILPs grow with the N×N demand entries times the links (the paper's "
            "study runs 8 and 16 ranks)",
            "`variopath run` and `variopath plan` compare VarioPath with its peers up to "
            f"{_runner_limit().ranks:,} ranks",
        )
    return RankLimit(
        MAX_TOPOLOGY_RANKS,
        "its path model holds the candidate paths of every rank-group pair",
        "node 0 alone (--nodes 1) shows every node's paths; NET joins the nodes",
    )


def _refuse(option: str, value: object, what: str, limit: str, instead: str = "") -> None:
    raise VarioPathError(
        f"{option} {value}: {what}, past the limit of {limit}" + (f"; {instead}" if instead else "")
    )


def _bytes(n: int) -> str:
    return f"{n:,} bytes ({n / 2**40:.3g} TiB)"


def check_sizes(args: argparse.Namespace, topo: Topology | None = None) -> None:
    """Refuse, before any work, a size ``args`` asks for (and, given the loaded topology, a
    deployment) that the command cannot handle; return quietly otherwise. The one check every
    command runs (``main`` calls it with the options, each command again with its topology)."""
    command = getattr(args, "command", None) or "variopath"
    name = " ".join(
        x
        for x in (
            command,
            getattr(args, "topo_command", None) or getattr(args, "catalog_command", None),
        )
        if x
    )
    limit = rank_limit(command)
    nodes = getattr(args, "nodes", None)
    if nodes is not None:
        if nodes < 1:
            raise VarioPathError(f"--nodes {nodes}: need at least 1 node")
        if nodes > limit.ranks:  # every node has at least one GPU
            _refuse(
                "--nodes",
                f"{nodes:,}",
                f"at least {nodes:,} ranks; {limit.why}",
                f"{limit.ranks:,} ranks for `variopath {name}`",
                limit.instead,
            )
    if topo is not None and topo.num_ranks > limit.ranks:
        n = topo.num_ranks
        raise VarioPathError(
            f"{topo.name} x {topo.nodes} has {n:,} ranks: {limit.why}, which `variopath {name}` "
            f"does up to {limit.ranks:,} ranks (--nodes {max(limit.ranks // topo.gpus_per_node, 1)}"
            f" here); {limit.instead}"
        )
    _check_bytes(args, topo)
    _check_counts(args)


def _check_bytes(args: argparse.Namespace, topo: Topology | None) -> None:
    top = MAX_BYTES_PER_RANK
    per_rank = getattr(args, "bytes_per_rank", None)
    if per_rank is not None and per_rank > top:
        _refuse("--bytes-per-rank", f"{per_rank:,}", f"{_bytes(per_rank)} a rank",
                f"{_bytes(top)} a rank")  # fmt: skip
    per_pair = getattr(args, "bytes_per_pair", None)
    if per_pair is not None:
        peers = topo.num_ranks - 1 if topo is not None else 1
        if per_pair * peers > top:
            _refuse("--bytes-per-pair", f"{per_pair:,}",
                    f"{_bytes(per_pair * peers)} a rank to its {peers:,} peer(s)",
                    f"{_bytes(top)} a rank")  # fmt: skip
    nbytes = getattr(args, "nbytes", None)
    if nbytes is not None and nbytes > top:
        _refuse("--nbytes", f"{nbytes:,}", _bytes(nbytes), f"{_bytes(top)} an experiment")
    probe = getattr(args, "probe_bytes", None)
    if probe is not None and probe > top:
        _refuse("--probe-bytes", f"{probe:,}", _bytes(probe), f"{_bytes(top)} a transfer")
    sizes = getattr(args, "sizes", None)
    if isinstance(sizes, str):  # gap: MiB per rank (cmd_gap reports what does not parse)
        try:
            mib = max((float(x) for x in sizes.split(",") if x.strip()), default=0.0)
        except ValueError:
            mib = 0.0
        if mib * 2**20 > top:
            _refuse("--sizes", sizes, f"{mib:g} MiB a rank", f"{top >> 20:,} MiB a rank")
    tokens = getattr(args, "tokens", None)
    if tokens is not None:
        top_k = getattr(args, "top_k", 8)
        row = tokens * top_k * getattr(args, "hidden", 7168) * getattr(args, "dtype_bytes", 2)
        if row > top:
            _refuse("--tokens", f"{tokens:,}", f"{_bytes(row)} a rank (tokens × top-k × hidden "
                    "× dtype bytes)", f"{_bytes(top)} a rank")  # fmt: skip
        draws = tokens * getattr(args, "experts", 256) * (topo.num_ranks if topo else 1)
        if draws > MAX_MOE_DRAWS:
            _refuse("--tokens", f"{tokens:,}", f"the MoE generator would draw {draws:,} routing "
                    "keys (ranks × tokens × experts)", f"{MAX_MOE_DRAWS:,} draws (about 15 s)")  # fmt: skip
    seq = getattr(args, "seq_len", None)
    if seq is not None:
        row = seq * getattr(args, "num_heads", 40) * getattr(args, "head_dim", 128)
        row *= getattr(args, "dtype_bytes", 2)
        if row > top:
            _refuse("--seq-len", f"{seq:,}", f"{_bytes(row)} of activations (sequence × heads "
                    "× head dim × dtype bytes)", f"{_bytes(top)}")  # fmt: skip


def _check_counts(args: argparse.Namespace) -> None:
    for option, attr, top, why in (
        ("--seeds", "seeds", MAX_SEEDS, "demands per point: each re-runs every point"),
        ("--repeats", "repeats", MAX_REPEATS, "runs per experiment"),
        ("--posts", "posts", MAX_POSTS, "transfers per cost probe"),
        ("--trigger-situations", "trigger_situations", MAX_TRIGGER_SITUATIONS,
         "situations of the trigger probe"),
    ):  # fmt: skip
        value = getattr(args, attr, None)
        if value is not None and value > top:
            _refuse(option, f"{value:,}", why, f"{top:,}")
