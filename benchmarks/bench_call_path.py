"""What the op's call path costs per family, against the estimate the choice charges for it (issue
51 item 4: gates estimate planning from measured costs).

The op applies a decision made ahead (``ffi/decider.h``) on its call path: ``layout.h
critical_path``, timed in C++ for rank 0, cold (``NativeChooser.critical_path_s``: the median of
``--repeats`` calls, each after ``--flush-mib`` of other memory traffic). Per deployment, MoE
dispatch demand (M = 16 and 1024 tokens per rank) and family the op may run without planning
anew (``staged``, ``concurrent``, ``multipath``, ``staged-balanced``, ``paced`` with the reference
split, ``rot-paced`` on nodes of several root complexes), it prints the measured cost, the
estimate (``ChoiceCore::apply_work_s``, ``ffi/choice.h``: ``kCallPathFloorS`` plus
``kCallPathSPerCell`` per demand cell it reads plus ``kCallPathSPerTransfer`` per transfer it
builds) and their ratio. The estimate's constants come from this benchmark: no measured call may
exceed its estimate by more than the noise of a shared machine (the largest ratio is printed).

Run: ``python benchmarks/bench_call_path.py [--repeats 25] [--flush-mib 64]``.
"""

from __future__ import annotations

import argparse
import statistics

from variopath_jax import _native, workloads
from variopath_jax.planner.reference import PlannerParams
from variopath_jax.planner.schedulers import chooser_for
from variopath_jax.schedulers import unprofiled_networks
from variopath_jax.topology import PathModel
from variopath_jax.topology.presets import preset

DEPLOYMENTS = (
    ("r5080-bf3", 1),
    ("r5080-bf3", 2),
    ("r5080-bf3", 8),
    ("l20-cx7", 1),
    ("l20-cx7", 2),
    ("r5080-cx8", 2),
    ("r5080-cx8", 8),
)
FAMILIES = ("staged", "concurrent", "multipath", "staged-balanced", "paced", "rot-paced")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=25)
    ap.add_argument("--flush-mib", type=int, default=64)
    args = ap.parse_args(argv)
    nets = unprofiled_networks(20e-6)
    print(
        f"{'deployment':<14} {'M':>5} {'family':<16} {'measured µs':>12} {'estimate µs':>12} {'ratio':>6}"
    )
    worst = 0.0
    for name, nodes in DEPLOYMENTS:
        topo = preset(name, nodes)
        chooser = chooser_for(PathModel(topo), PlannerParams())
        for tokens in (16, 1024):
            demand = workloads.moe(topo.num_ranks, tokens, seed=0)
            for family in FAMILIES:
                decision = _native.Decision(family)
                if chooser.apply(decision, demand, nets).meta["plan"] != family:
                    continue  # rot-paced on one root complex: not built
                seconds = chooser.critical_path_s(
                    decision,
                    demand,
                    nets,
                    0,
                    repeats=args.repeats,
                    flush_bytes=args.flush_mib << 20,
                )
                measured = statistics.median(seconds)
                estimate = chooser.apply_work_s(decision, demand, nets)
                worst = max(worst, measured / estimate)
                print(
                    f"{name} x{nodes:<4} {tokens:>5} {family:<16} {measured * 1e6:>12.1f} "
                    f"{estimate * 1e6:>12.1f} {measured / estimate:>6.2f}",
                    flush=True,
                )
    print(f"largest measured ÷ estimate: {worst:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
