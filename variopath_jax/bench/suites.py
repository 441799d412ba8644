"""The evaluation suites of ``variopath bench``, one per figure or table of the paper's §6.

A :class:`Suite` is data: the workload it sweeps, the deployments and swept values of its full and
``--quick`` runs, the systems it compares (VarioPath first) and the paper's claims about them. The
harness (:mod:`variopath_jax.bench.harness`) turns a suite into :class:`Point` s and runs every
system on every point.

Swept values by workload: ``moe`` sweeps tokens per rank M (DeepSeek-style routing, 256 experts,
top-8, hidden 7168, bf16: one token is 14 KiB and reaches about 7 ranks at 32–64 GPUs, so M = 1
already sends about 100 KiB per rank); ``uniform`` sweeps the message size in MiB per rank (each
rank sends size / N to each of the N − 1 others, nccl-tests' convention); ``zipf`` sweeps the
skewness s at 32 MiB per rank; ``trace`` sweeps the step of a moving routing trace
(``variopath_jax.traces.moving_trace``: DeepSeek-V3's 256 experts, top-8, hidden 7168, bf16,
M = 128 tokens per rank, expert popularity drifting and bursting; one row per (token, expert),
as ``moe_dispatch`` sends them, where ``moe`` sends a token once per rank).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from variopath_jax import traces, workloads
from variopath_jax.errors import VarioPathError

ZIPF_BYTES_PER_RANK = 32 << 20
TRACE_TOKENS, TRACE_EXPERTS, TRACE_TOP_K, TRACE_TOKEN_BYTES = 128, 256, 8, 7168 * 2
PLATFORMS = ("r5080-cx8", "r5080-bf3", "r5090-bf3", "l20-cx7")


@dataclass(frozen=True)
class System:
    """One compared system: a registered scheduler on the full or the nearest-only path model.

    Attributes
    ----------
    label : str
        Its name in tables, plots and the CSV ``scheduler`` column.
    scheduler : str
        The registered scheduler that plans it.
    nearest : bool
        Plan on ``PathModel(topo, only_nearest=True)``: every pair keeps its nearest path.
    catalog : bool
        It plans from the deployment's channel catalog, so it is unavailable where none builds.
    """

    label: str
    scheduler: str
    nearest: bool = False
    catalog: bool = False


VARIOPATH = System("variopath", "variopath", catalog=True)
# planned once over pcie and pcie-fair (the least-regret candidate), judged under each:
# what the op runs on a machine that has not been measured
VARIOPATH_ROBUST = System("variopath-robust", "variopath-robust", catalog=True)


def peer(name: str) -> System:
    """A peer scheduler on the full path model."""
    return System(name, name)


@dataclass(frozen=True)
class Claim:
    """What the paper says about VarioPath against one system in one suite.

    Attributes
    ----------
    system : str
        The compared system's label.
    ratio : float or None
        The paper's geomean completion-time ratio system / VarioPath (None: no single number).
    text : str
        The claim in words, with its source.
    at : float or None
        The swept value the claim is about (None: the whole suite).
    """

    system: str
    ratio: float | None
    text: str
    at: float | None = None


@dataclass(frozen=True)
class Sweep:
    """The deployments, swept values and seeds of one run of a suite."""

    deployments: tuple[tuple[str, int], ...]
    values: tuple[float, ...]
    seeds: int = 1


@dataclass(frozen=True)
class Point:
    """One demand of a suite: a deployment, the swept value and the workload seed."""

    topology: str
    nodes: int
    value: float
    seed: int = 0


@dataclass(frozen=True)
class Suite:
    """One figure or table of the paper as a benchmark.

    Attributes
    ----------
    name, title : str
        The CLI name (``fig7``) and a one-line description, without the deployments:
        ``title_for`` adds the GPU counts a run shows (a ``--quick`` run shows fewer).
    workload : str
        ``moe``, ``uniform``, ``zipf`` or ``trace`` (see the module docstring for the swept
        value).
    full, quick : Sweep
        The deployments and values of a full and of a ``--quick`` run.
    systems : tuple of System
        VarioPath first, then the systems compared against it (``variopath-robust``, where
        present, is VarioPath's own plan for an unmeasured machine, compared like a peer).
    claims : tuple of Claim
        The paper's numbers for the summary.
    bound_lp : bool or None
        Compute the flow-LP bound (None: when small enough, see ``solver.bound``; False: the
        endpoint bound only).
    plot : str
        ``lines`` (bandwidth against the swept value, one panel per deployment) or ``bars``
        (completion time normalised to VarioPath, the ablation table).
    x : str
        The x axis of ``lines``: ``value`` (the swept value) or ``payload`` (bytes per rank).
    """

    name: str
    title: str
    workload: str
    full: Sweep
    quick: Sweep
    systems: tuple[System, ...]
    claims: tuple[Claim, ...] = ()
    bound_lp: bool | None = None
    plot: str = "lines"
    x: str = "value"

    def title_for(self, rows: list[dict]) -> str:
        """The title with the GPU counts ``rows`` cover: "..., 32 GPUs", "..., 32 and 64 GPUs"."""
        return f"{self.title}, {gpu_counts(rows)}" if rows else self.title

    def points(self, quick: bool = False, seeds: int | None = None) -> list[Point]:
        """Every point of a run, deployment by deployment; ``seeds`` overrides the sweep's count
        for random workloads (uniform demands have one)."""
        sweep = self.quick if quick else self.full
        count = 1 if self.workload == "uniform" else (seeds or sweep.seeds)
        if count < 1:
            raise VarioPathError(f"--seeds must be at least 1, got {count}")
        return [
            Point(topology, nodes, value, seed)
            for topology, nodes in sweep.deployments
            for value in sweep.values
            for seed in range(count)
        ]

    def demand(self, point: Point, ranks: int) -> np.ndarray:
        """The demand matrix of ``point`` on a deployment of ``ranks`` GPUs."""
        if self.workload == "moe":
            return workloads.moe(ranks, int(point.value), seed=point.seed)
        if self.workload == "uniform":
            return workloads.uniform(ranks, int(point.value * 2**20) // ranks)
        if self.workload == "zipf":
            return workloads.zipf(ranks, point.value, ZIPF_BYTES_PER_RANK, seed=point.seed)
        if self.workload == "trace":
            step = int(point.value)
            trace = traces.moving_trace(
                step + 1,
                ranks,
                TRACE_TOKENS,
                experts=TRACE_EXPERTS,
                top_k=TRACE_TOP_K,
                seed=point.seed,
            )
            return trace.demand(step, TRACE_TOKEN_BYTES)
        raise VarioPathError(f"suite {self.name}: unknown workload {self.workload!r}")

    def params(self, point: Point) -> dict[str, float | int | None]:
        """The workload parameters of ``point`` as CSV columns."""
        moe, uniform = self.workload == "moe", self.workload == "uniform"
        trace = self.workload == "trace"
        return {
            "tokens": int(point.value) if moe else (TRACE_TOKENS if trace else None),
            "mib_per_rank": point.value if uniform else None,
            "skew": point.value if self.workload == "zipf" else None,
            "step": int(point.value) if trace else None,
        }

    @property
    def peers(self) -> tuple[System, ...]:
        return self.systems[1:]


_MOE_TOKENS = tuple(float(2**k) for k in range(10))  # M = 1 .. 512

SUITES: dict[str, Suite] = {
    s.name: s
    for s in (
        Suite(
            "fig7",
            "Figure 7: MoE AlltoAllv (random top-8 routing)",
            "moe",
            full=Sweep(
                (("r5080-bf3", 4), ("r5080-bf3", 8), ("r5090-bf3", 2), ("r5090-bf3", 4)),
                _MOE_TOKENS,
            ),
            quick=Sweep((("r5080-bf3", 4),), (1.0, 16.0, 256.0)),
            systems=(
                VARIOPATH,
                VARIOPATH_ROBUST,
                peer("nccl"),
                peer("fast"),
                peer("deepep"),
                peer("deepep-rdma"),
                peer("railwave"),
            ),
            claims=(
                Claim("fast", 5.88, "5.88x on average (abstract); 3.49-9.41x per deployment"),
                Claim("deepep", 1.72, "1.72x on average (abstract); 1.55-2.00x per deployment"),
                Claim("nccl", None, "3.73-10.61x per deployment; fastest on all 42 points"),
            ),
            x="payload",
        ),
        Suite(
            "fig8",
            "Figure 8: uniform AlltoAll",
            "uniform",
            full=Sweep(
                tuple((p, n) for n in (1, 2) for p in PLATFORMS),
                tuple(float(2**k) for k in range(10)),  # 1 .. 512 MiB
            ),
            quick=Sweep(
                (("r5080-bf3", 1), ("r5090-bf3", 1), ("r5080-bf3", 2), ("l20-cx7", 2)),
                (1.0, 64.0),
            ),
            systems=(VARIOPATH, VARIOPATH_ROBUST, peer("nccl"), peer("msccl")),
            claims=(
                Claim("nccl", 1.82, "1.82x geomean over 80 configurations; faster on every one"),
                Claim("msccl", 1.99, "1.99x geomean; faster on all but 1 MiB, 1-node R5080-BF3"),
            ),
        ),
        Suite(
            "fig9",
            "Figure 9: skew (Zipf) AlltoAllv, 32 MiB per rank",
            "zipf",
            full=Sweep(tuple((p, 2) for p in PLATFORMS), (0.4, 0.6, 0.8), seeds=5),
            quick=Sweep((("r5080-bf3", 2), ("l20-cx7", 2)), (0.4, 0.8)),
            systems=(VARIOPATH, VARIOPATH_ROBUST, peer("nccl"), peer("fast"), peer("railwave")),
            claims=(
                Claim("fast", 2.16, "2.16x geomean, 1.99-2.39x per platform"),
                Claim("nccl", None, "fastest in all 12 configurations"),
            ),
        ),
        Suite(
            "fig10",
            "Figure 10: large-scale MoE AlltoAllv on r5080-cx8",
            "moe",
            full=Sweep((("r5080-cx8", 32),), tuple(float(2**k) for k in range(8))),  # M = 1 .. 128
            quick=Sweep((("r5080-cx8", 8),), (1.0, 128.0)),
            systems=(VARIOPATH, VARIOPATH_ROBUST, peer("deepep"), peer("nccl")),
            claims=(
                Claim("deepep", 30.91 / 28.11, "1.10x at M=128 (30.91 vs 28.11 GB/s)", at=128.0),
                Claim("nccl", 30.91 / 18.85, "1.64x at M=128 (30.91 vs 18.85 GB/s)", at=128.0),
            ),
        ),
        Suite(
            "steps",
            "MoE dispatch over the steps of a moving routing trace (issue 30), r5080-cx8",
            "trace",
            full=Sweep((("r5080-cx8", 8),), tuple(float(s) for s in range(0, 100, 10))),
            quick=Sweep((("r5080-cx8", 2),), (0.0, 1.0)),
            systems=(
                VARIOPATH,
                VARIOPATH_ROBUST,
                peer("nccl"),
                peer("deepep"),
                peer("deepep-rdma"),
            ),
        ),
        Suite(
            "table3",
            "Table 3: peer/path ablation, r5080-bf3 x 2, Zipf 0.6, 32 MiB per rank",
            "zipf",
            full=Sweep((("r5080-bf3", 2),), (0.6,), seeds=5),
            quick=Sweep((("r5080-bf3", 2),), (0.6,)),
            systems=(  # the ablation of the paper's algorithm, as the paper has it
                System("variopath-paper", "variopath-paper", catalog=True),
                System("variopath-fixed-peer", "variopath-fixed-peer"),
                System("variopath-fixed-path", "variopath-fixed-path", nearest=True, catalog=True),
                System("variopath-fixed-both", "variopath-fixed-peer", nearest=True),
            ),
            claims=(
                Claim("variopath-fixed-peer", 2.00, "fixed peer rotation, dynamic path: 2.00x"),
                Claim(
                    "variopath-fixed-path", 2.03, "demand-aware peers, fixed nearest path: 2.03x"
                ),
                Claim("variopath-fixed-both", 2.84, "fixed peer rotation and nearest path: 2.84x"),
            ),
            plot="bars",
        ),
    )
}


def resolve(names: list[str]) -> list[Suite]:
    """The suites named on the command line, in the order given; ``all`` means every suite."""
    out: list[Suite] = []
    for name in names:
        if name == "all":
            chosen = list(SUITES.values())
        elif name in SUITES:
            chosen = [SUITES[name]]
        else:
            raise VarioPathError(
                f"unknown suite {name!r}; known suites: {', '.join(SUITES)}, or all"
            )
        out += [s for s in chosen if s not in out]
    return out


def gpu_counts(rows: list[dict]) -> str:
    """The deployments' sizes ``rows`` cover, in words: "32 GPUs", "16 and 32 GPUs",
    "8, 16 and 32 GPUs"."""
    counts = [f"{n:,}" for n in sorted({int(r["ranks"]) for r in rows})]
    words = counts[0] if len(counts) == 1 else ", ".join(counts[:-1]) + " and " + counts[-1]
    return f"{words} GPU{'s' if counts != ['1'] else ''}"
