"""A paced plan executed by the CPU op with links slowed by emulation, against its prediction.

The links of r5080-bf3 are slowed ``--slow`` times (every capacity of its spec divided), so that
what bounds a transfer is its link, not this machine's memory: the slowed topology's paced plan
caps each transfer at its share of a slowed link, and the CPU op's copies, far faster than
those caps, take as long as the caps say only if the executor enforces them while the bytes
move and keeps a sender's transfers of one step in flight together (copied at full speed and
then held, one after another, the same plan took ~9x its prediction: issue 28). The slowed
links are emulated by nothing but the caps: the unpaced plans of the same topology would run at
this machine's memory speed, so only the paced plan's time is compared with its prediction.

Printed: the plan ``execution="planned"`` chose under ``pcie-fair`` (the paced one here), its
time predicted by the C++ choice (analytic) and by the fluid simulator (the judge), the op's
median time over ``--rounds`` calls with its interquartile spread, and executed / predicted
(goal <= 1.3). Run: ``python benchmarks/bench_paced.py [--json] [--rounds 9] [--slow 200]
[--mib 1]``.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import argparse
import json
import time

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from variopath_jax.jax_ops import all_to_all_v, configure, last_schedule
from variopath_jax.schedulers import PlanRequest, get_scheduler
from variopath_jax.sim import FluidSimulator
from variopath_jax.sim.network import load_networks
from variopath_jax.topology import PathModel, Topology, preset
from variopath_jax.topology.spec import from_spec, to_spec

N = 8
ROW = 128  # bytes per row


def slowed(topology: Topology, factor: float) -> Topology:
    """``topology`` with every link capacity (every ``*_gbs`` field of its spec) divided by
    ``factor``."""

    def scale(value):
        if isinstance(value, dict):
            return {
                k: v / factor if k.endswith("gbs") and isinstance(v, int | float) else scale(v)
                for k, v in value.items()
            }
        if isinstance(value, list):
            return [scale(v) for v in value]
        return value

    return from_spec(scale(to_spec(topology)), f"{topology.name} slowed {factor:g}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--slow", type=float, default=200.0, help="links slowed this many times")
    parser.add_argument("--mib", type=float, default=1.0, help="MiB from every rank to every rank")
    args = parser.parse_args()
    topology = slowed(preset("r5080-bf3"), args.slow)
    config = configure(topology, network="pcie-fair", debug=True)
    mesh = jax.make_mesh((N,), ("x",), axis_types=(jax.sharding.AxisType.Explicit,))
    put = lambda a: jax.device_put(a, NamedSharding(mesh, P("x")))  # noqa: E731
    per_peer = int(args.mib * (1 << 20)) // ROW
    x = put(np.ones((N * N * per_peer, ROW // 4), np.float32))
    counts = put(np.full((N, N), per_peer, np.int32))
    op = jax.jit(
        jax.shard_map(
            lambda xb, cb: all_to_all_v(xb, cb[0], axis_name="x", config=config)[0],
            mesh=mesh,
            in_specs=(P("x"), P("x")),
            out_specs=P("x"),
        )
    )
    for _ in range(2):
        op(x, counts).block_until_ready()
    plan = str(last_schedule()["plan"])
    times = []
    for _ in range(args.rounds):
        start = time.perf_counter()
        op(x, counts).block_until_ready()
        times.append(time.perf_counter() - start)
    demand = np.full((N, N), per_peer * ROW, np.int64)
    np.fill_diagonal(demand, 0)
    networks = load_networks("pcie-fair")
    request = PlanRequest(
        demand,
        PathModel(topology),
        networks[0].barrier_s,
        network="pcie-fair",
    )
    schedule = get_scheduler("variopath").plan(request)
    predicted = schedule.meta["predicted_s"]["pcie-fair"][plan]
    simulated = FluidSimulator(topology, networks[0]).run(schedule).completion_s
    med = float(np.median(times))
    out = {
        "slow": args.slow,
        "bytes_per_pair": per_peer * ROW,
        "plan": plan,
        "predicted_s": predicted,
        "simulated_s": simulated,
        "median_s": med,
        "iqr_s": [float(q) for q in np.percentile(times, [25, 75])],
        "executed_over_predicted": med / predicted,
        "executed_over_simulated": med / simulated,
    }
    if args.json:
        print(json.dumps(out))
        return
    ms = lambda s: f"{s * 1e3:.2f} ms"  # noqa: E731
    print(
        f"r5080-bf3, links slowed {args.slow:g}x, {args.mib:g} MiB rank to rank; plan "
        f"{plan!r} (pcie-fair); predicted {ms(predicted)} (analytic), {ms(simulated)} (simulated)"
    )
    print(
        f"executed: median {ms(med)} [{ms(out['iqr_s'][0])}-{ms(out['iqr_s'][1])}] over "
        f"{args.rounds} calls; executed / predicted {out['executed_over_predicted']:.2f} "
        f"(/ simulated {out['executed_over_simulated']:.2f}; goal <= 1.3)"
    )


if __name__ == "__main__":
    main()
