"""The layers' exchanges per training step, simulated, and the layers run for real (issue 30).

``sim``: per step of a moving routing trace (``variopath_jax.traces.moving_trace``), the MoE
block's four exchanges (dispatch D and combine Dᵀ forward; their transposes Dᵀ and D backward)
and Ulysses attention's four (q/k/v sequence→heads Q, output heads→sequence O forward; Oᵀ and Qᵀ
backward), for shapes modelled on Qwen3-30B-A3B (128 experts, top-8, hidden 2048; attention 32
query / 4 KV heads of 128) and DeepSeek-V3 (256 experts, top-8, hidden 7168; MLA as 128 heads of
q/k 192 and v 128), bf16, ``--tokens`` tokens per rank (default 4,096), experts spread evenly, one
row per (token, expert) as ``moe_dispatch`` sends them (no deduplication). For each preset scale
(``--scales``, GPUs on ``--preset``, 8 per node), scheduler and network model (``pcie``,
``pcie-fair``, ``none``): communication (the simulated completion of the four exchanges),
planning (the scheduler's own time for D and Dᵀ, or Q and O and their transposes, each planned
fresh), and their sum, averaged over ``--steps`` steps (default 100). Model-aware schedulers
plan for each model; the others plan once and are judged under each. ``variopath`` is the
C++ choice made for each model; ``variopath-op`` is what the op runs by default: the C++ choice
robust over the three models (``variopath-robust``; planning: the C++ core's call, without
building a Python schedule), planned for the step's forward demands only (D; Q
and O), their transposes run as those plans reversed
(``reversed_schedule``, validated against the transposed demand and simulated), as the op's plan
cache serves them. Ulysses needs the heads to split over the ranks (query heads a multiple of N; KV
heads replicated when fewer, as Ulysses does for GQA); scales where they do not are skipped.

``real``: the MoE block and Ulysses attention on 8 forced CPU devices (an (8,) mesh), ``--real-steps``
training steps of forward and backward with fresh tokens each step, each checked against the
dense single-device reference (max relative error over outputs and gradients), with the op's
planning counted per step (``variopath_jax._native.plan_counts``: planned anew, served as is,
served transposed).

Run: ``python benchmarks/bench_layers.py sim --quick`` (16 GPUs, 3 steps, 4 schedulers),
``python benchmarks/bench_layers.py sim --scales 16 --steps 10``, ``python
benchmarks/bench_layers.py real`` (``--json`` for JSON rows).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import dataclass

import numpy as np

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")


@dataclass(frozen=True)
class Shape:
    """A model's MoE and attention shape (bf16)."""

    name: str
    experts: int
    top_k: int
    hidden: int
    heads: int
    kv_heads: int
    qk_dim: int
    v_dim: int


SHAPES = {
    "qwen3-30b-a3b": Shape("qwen3-30b-a3b", 128, 8, 2048, 32, 4, 128, 128),
    "deepseek-v3": Shape("deepseek-v3", 256, 8, 7168, 128, 128, 192, 128),
}
MODELS = ("pcie", "pcie-fair", "none")
QUICK_SCHEDULERS = ("variopath-op", "variopath", "nccl", "deepep", "pairwise")


def ulysses_demands(shape: Shape, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """The q/k/v (sequence→heads) and output (heads→sequence) demands, bytes, for per-rank
    token counts ``lengths``; None when the query heads do not split over the ranks."""
    n = len(lengths)
    if shape.heads % n:
        return None
    q_heads = shape.heads // n
    kv_heads = max(shape.kv_heads // n, 1)  # replicated KV heads when fewer than ranks
    per_token_in = 2 * (q_heads * shape.qk_dim + kv_heads * (shape.qk_dim + shape.v_dim))
    per_token_out = 2 * q_heads * shape.v_dim
    q = np.repeat(lengths[:, None] * per_token_in, n, axis=1).astype(np.int64)
    o = np.repeat(lengths[None, :] * per_token_out, n, axis=0).astype(np.int64)
    np.fill_diagonal(q, 0)
    np.fill_diagonal(o, 0)
    return q, o


# The op's default (execution="planned"): the C++ choice robust over the three models; it plans a
# step's forward demands only (the transposes reuse them).
OP = "variopath-op"


def _op_step(model, fwd: list[np.ndarray], nets) -> list[dict]:
    """The op's default for a step's forward demands: each planned once (the C++ choice robust
    over the three models) and its transpose run as the plan reversed, both
    validated and simulated under each model; planning charged once per forward demand, the C++
    core's call (``core_s``), which is what the op's FFI handler runs."""
    from variopath_jax.runner import evaluate, run_one
    from variopath_jax.schedule import reversed_schedule

    topo = model.topology
    comm = {n.name: 0.0 for n in nets}
    plan = 0.0
    for d in fwd:
        r = run_one(model, "variopath-robust", d, network=nets[0])
        plan += r.schedule.meta["core_s"]  # the C++ call the op makes (no Python schedule)
        back = reversed_schedule(r.schedule, topo.graph)
        for net in nets:
            comm[net.name] += evaluate(topo, r.schedule, d, net, invalid="raise")[1].completion_s
            comm[net.name] += evaluate(topo, back, d.T.copy(), net, invalid="raise")[1].completion_s
    return [{"model": n.name, "comm_s": comm[n.name], "plan_s": plan} for n in nets]


def _plan_and_time(model, scheduler: str, demands: list[np.ndarray], nets) -> list[dict]:
    """Per network model: total simulated completion and planning over ``demands``."""
    from variopath_jax.runner import run_one
    from variopath_jax.schedulers import get_scheduler
    from variopath_jax.sim import FluidSimulator

    comm = {n.name: 0.0 for n in nets}
    plan = {n.name: 0.0 for n in nets}
    aware = get_scheduler(scheduler).model_aware
    for d in demands:
        if aware:
            for net in nets:
                r = run_one(model, scheduler, d, network=net)
                comm[net.name] += r.sim.completion_s
                plan[net.name] += r.plan_s or 0.0
        else:
            r = run_one(model, scheduler, d, network=nets[0])
            for net in nets:
                sim = (
                    r.sim if net is nets[0] else FluidSimulator(model.topology, net).run(r.schedule)
                )
                comm[net.name] += sim.completion_s
                plan[net.name] += r.plan_s or 0.0
    return [{"model": n.name, "comm_s": comm[n.name], "plan_s": plan[n.name]} for n in nets]


def simulate(args: argparse.Namespace) -> list[dict]:
    from variopath_jax.catalog import CatalogError
    from variopath_jax.schedulers import scheduler_names
    from variopath_jax.sim.network import load_networks
    from variopath_jax.topology import PathModel, preset
    from variopath_jax.traces import moving_trace, packed_lengths

    nets = [n.replace(barrier_s=args.lambda_s) for n in load_networks(list(MODELS))]
    schedulers = args.schedulers.split(",") if args.schedulers else [*scheduler_names(), OP]
    rows = []
    for gpus in args.scales:
        topo = preset(args.preset, max(gpus // 8, 1))
        if topo.num_ranks != gpus:
            raise SystemExit(f"{args.preset} has {topo.num_ranks} GPUs at {gpus // 8} nodes")
        model = PathModel(topo)
        for shape in (SHAPES[s] for s in args.shapes):
            trace = moving_trace(
                args.steps, gpus, args.tokens, experts=shape.experts, top_k=shape.top_k,
                seed=args.seed,
            )  # fmt: skip
            lengths = packed_lengths(args.steps, gpus, args.tokens, seed=args.seed)
            layers = []
            if "moe" in args.layers and shape.experts < gpus:
                rows.append({"gpus": gpus, "shape": shape.name, "layer": "moe", "scheduler": "-",
                             "error": f"{shape.experts} experts on {gpus} GPUs: not modelled "
                                      "(an expert per GPU at least)"})  # fmt: skip
            elif "moe" in args.layers:
                layers.append(
                    ("moe", [trace.demand(s, shape.hidden * 2) for s in range(args.steps)])
                )
            if "ulysses" in args.layers:
                ul = [ulysses_demands(shape, lengths[s]) for s in range(args.steps)]
                if ul[0] is not None:
                    layers.append(("ulysses", ul))
            for layer, per_step in layers:
                for scheduler in schedulers:
                    start = time.perf_counter()
                    totals: dict[str, dict] = {}
                    try:
                        for step in per_step:
                            fwd = [step] if layer == "moe" else list(step)
                            demands = fwd + [d.T.copy() for d in fwd]  # D, Dᵀ (and O, Oᵀ)
                            for r in (
                                _op_step(model, fwd, nets)
                                if scheduler == OP
                                else _plan_and_time(model, scheduler, demands, nets)
                            ):
                                t = totals.setdefault(r["model"], {"comm_s": 0.0, "plan_s": 0.0})
                                # moe: D, Dᵀ each run twice (forward and backward)
                                k = 2 if layer == "moe" else 1
                                t["comm_s"] += k * r["comm_s"]
                                t["plan_s"] += r["plan_s"]
                    except (CatalogError, MemoryError) as err:
                        rows.append({"gpus": gpus, "shape": shape.name, "layer": layer,
                                     "scheduler": scheduler, "error": str(err)})  # fmt: skip
                        continue
                    wall = time.perf_counter() - start
                    for name, t in totals.items():
                        steps = len(per_step)
                        row = {
                            "gpus": gpus,
                            "shape": shape.name,
                            "layer": layer,
                            "scheduler": scheduler,
                            "model": name,
                            "steps": steps,
                            "comm_ms": t["comm_s"] / steps * 1e3,
                            "plan_ms": t["plan_s"] / steps * 1e3,
                            "sum_ms": (t["comm_s"] + t["plan_s"]) / steps * 1e3,
                            "wall_s": wall,
                        }
                        rows.append(row)
                        if args.progress:
                            print(json.dumps(row), flush=True)
    return rows


def real(steps: int, seed: int) -> list[dict]:
    """The layers on an (8,) mesh of CPU devices against the dense references, per step."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from variopath_jax._native import plan_counts
    from variopath_jax.jax_ops import configure
    from variopath_jax.layers import (
        attention_reference,
        init_attention,
        init_moe,
        moe_block,
        moe_reference,
        ulysses_attention,
    )

    n, t, d, f, local, k = 8, 32, 32, 64, 2, 2
    heads, hd, rows = 8, 8, 16
    cfg = configure(devices=n, timeout_s=60.0)
    mesh = jax.make_mesh((n,), ("m",), axis_types=(jax.sharding.AxisType.Explicit,))
    put = lambda a, s: jax.device_put(a, NamedSharding(mesh, s))  # noqa: E731
    moe = init_moe(seed, d, f, n * local)
    mspec = type(moe)(P(), P("m"), P("m"))
    moe_s = jax.tree.map(put, moe, mspec)
    att = init_attention(seed, d, heads, hd)

    def moe_loss(x, p, v):
        body = lambda xb, pb: moe_block(xb, pb, axis_name="m", top_k=k, config=cfg)[0]  # noqa: E731
        return (
            jax.shard_map(body, mesh=mesh, in_specs=(P("m"), mspec), out_specs=P("m"))(x, p) * v
        ).sum()

    def att_loss(x, lens, p, v):
        def body(xb, nb, pb):
            return ulysses_attention(xb[0], nb[0], pb, axis_name="m", heads=heads, config=cfg)[None]

        spec = (P("m"), P("m"), type(p)(P(), P(), P(), P()))
        return (
            jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=P("m"))(x, lens, p) * v
        ).sum()

    moe_step = jax.jit(jax.value_and_grad(moe_loss, argnums=(0, 1)))
    att_step = jax.jit(jax.value_and_grad(att_loss, argnums=(0, 2)))
    rng = np.random.default_rng(seed)
    out = []

    def rel(got, want) -> float:
        got, want = np.asarray(got), np.asarray(want)
        return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))

    for step in range(steps):
        x = rng.standard_normal((n * t, d)).astype(np.float32)
        v = rng.standard_normal((n * t, d)).astype(np.float32)
        before = np.asarray(plan_counts())
        start = time.perf_counter()
        loss, (gx, gp) = jax.block_until_ready(moe_step(put(x, P("m")), moe_s, put(v, P("m"))))
        moe_wall = time.perf_counter() - start
        counts = np.asarray(plan_counts()) - before
        ref = lambda xa, pa, v=v: (moe_reference(xa, pa, top_k=k) * v).sum()  # noqa: E731
        rl, (rx, rp) = jax.value_and_grad(ref, argnums=(0, 1))(x, moe)
        moe_err = max(
            rel(loss, rl), rel(gx, rx), *(rel(getattr(gp, a), getattr(rp, a)) for a in ("router", "w1", "w2"))
        )  # fmt: skip
        lens = rng.integers(1, rows + 1, size=n).astype(np.int32)
        xa = rng.standard_normal((n, rows, d)).astype(np.float32)
        xa = np.where(np.arange(rows)[None, :, None] < lens[:, None, None], xa, 0)
        va = rng.standard_normal((n, rows, d)).astype(np.float32)
        start = time.perf_counter()
        aloss, (gax, gap) = jax.block_until_ready(
            att_step(put(xa, P("m")), put(lens, P("m")), att, put(va, P("m")))
        )
        att_wall = time.perf_counter() - start
        keep = np.arange(rows)[None, :] < lens[:, None]

        def att_ref(xf, p, keep=keep, va=va):
            y = attention_reference(xf[keep], p, heads=heads)
            full = jnp.zeros((n * rows, d)).at[np.flatnonzero(keep.reshape(-1))].set(y)
            return (full.reshape(n, rows, d) * va).sum()

        ral, (rax, rap) = jax.value_and_grad(att_ref, argnums=(0, 1))(jnp.asarray(xa), att)
        att_err = max(
            rel(aloss, ral), rel(gax, rax), *(rel(getattr(gap, a), getattr(rap, a)) for a in ("wq", "wk", "wv", "wo"))
        )  # fmt: skip
        out.append({
            "step": step, "moe_max_rel_err": moe_err, "ulysses_max_rel_err": att_err,
            "moe_planned": int(counts[0]), "moe_cached": int(counts[1]),
            "moe_transposed": int(counts[2]), "moe_step_ms": moe_wall * 1e3,
            "ulysses_step_ms": att_wall * 1e3,
        })  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("what", choices=("sim", "real"))
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--quick", action="store_true", help="16 GPUs, 3 steps, 4 schedulers")
    parser.add_argument("--scales", default="16,64,256", help="GPUs, comma-separated")
    parser.add_argument("--preset", default="r5080-cx8")
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--layers", default="moe,ulysses")
    parser.add_argument("--schedulers", default="", help="comma-separated (default: all)")
    parser.add_argument("--tokens", type=int, default=4096, help="tokens per rank")
    parser.add_argument("--lambda-s", type=float, default=20e-6, help="barrier cost λ")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--real-steps", type=int, default=5)
    parser.add_argument("--progress", action="store_true", help="print each row as it is done")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.what == "real":
        rows = real(args.real_steps, args.seed)
        if args.json:
            print(json.dumps(rows))
            return
        print(f"{'step':>4}{'moe rel err':>13}{'ulysses rel err':>17}{'planned':>9}{'cached':>8}"
              f"{'transposed':>11}{'moe ms':>9}{'ulysses ms':>12}")  # fmt: skip
        for r in rows:
            print(f"{r['step']:>4}{r['moe_max_rel_err']:>13.2e}{r['ulysses_max_rel_err']:>17.2e}"
                  f"{r['moe_planned']:>9}{r['moe_cached']:>8}{r['moe_transposed']:>11}"
                  f"{r['moe_step_ms']:>9.1f}{r['ulysses_step_ms']:>12.1f}")  # fmt: skip
        return
    args.scales = [int(s) for s in args.scales.split(",")]
    args.shapes = args.shapes.split(",")
    args.layers = args.layers.split(",")
    if args.quick:
        args.scales, args.steps = [16], 3
        args.schedulers = args.schedulers or ",".join(QUICK_SCHEDULERS)
    rows = simulate(args)
    if args.json:
        print(json.dumps(rows))
        return
    print(f"{'GPUs':>4} {'shape':<14}{'layer':<8}{'scheduler':<21}{'model':<11}{'steps':>5}"
          f"{'comm ms':>10}{'plan ms':>10}{'sum ms':>10}")  # fmt: skip
    for r in rows:
        if "error" in r:
            print(f"{r['gpus']:>4} {r['shape']:<14}{r['layer']:<8}{r['scheduler']:<21}{r['error']}")
            continue
        print(f"{r['gpus']:>4} {r['shape']:<14}{r['layer']:<8}{r['scheduler']:<21}{r['model']:<11}"
              f"{r['steps']:>5}{r['comm_ms']:>10.3f}{r['plan_ms']:>10.3f}{r['sum_ms']:>10.3f}")  # fmt: skip
    # the goal: variopath's plan + communication at most every peer's, per point and model
    points: dict[tuple, dict[str, float]] = {}
    for r in rows:
        if "error" not in r:
            key = (r["gpus"], r["shape"], r["layer"], r["model"])
            points.setdefault(key, {})[r["scheduler"]] = r["sum_ms"]
    comm: dict[tuple, dict[str, float]] = {}
    for r in rows:
        if "error" not in r:
            key = (r["gpus"], r["shape"], r["layer"], r["model"])
            comm.setdefault(key, {})[r["scheduler"]] = r["comm_ms"]
    for mine in ("variopath", OP):
        for what, table in (("plan + communication", points), ("communication only", comm)):
            wins = [
                points[key][mine] <= min(peers)
                for key, sums in points.items()
                if mine in sums
                and (peers := [v for s, v in table[key].items() if not s.startswith("variopath")])
            ]
            print(f"{mine}: plan + communication at most every peer's {what} at {sum(wins)}/"
                  f"{len(wins)} (scale, shape, layer, model) points")  # fmt: skip


if __name__ == "__main__":
    main()
