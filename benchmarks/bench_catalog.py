"""Offline catalog construction for the paper's Table 4 deployments, as modeled by our presets.

Prints, per deployment, shapes, families, serialised bytes and seconds (building and serialising)
beside the paper's figures. Each build runs in its own process with a time limit (default 60 s,
the goal on a 2-core machine); the whole set should finish in under 2 minutes.

Our presets' wiring is an assumption (docs/topology.md): the paper's machines evidently admit far
fewer channel shapes than ours (its L20-CX7 node has 92 shapes; our preset, with NIC loopback
between switches and two NICs per switch, admits 1,992), so counts are not comparable one to one.
Flat catalogs are built for one node; multi-node deployments use the factored catalog, whose
size does not depend on the node count.

Run: ``python benchmarks/bench_catalog.py [--limit 60] [--json]``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import time

# (label, preset, nodes, paper shapes, paper families, paper KiB, paper seconds) — paper Table 4
DEPLOYMENTS = [
    ("R5080-BF3-8", "r5080-bf3", 1, 3, 6, 1.7, 0.8),
    ("R5080-BF3-16", "r5080-bf3", 2, 41, 438, 132.0, 4.95),
    ("R5080-CX8-256", "r5080-cx8", 32, 1616, 2140, 172682.6, 5673.603),
    ("R5090-BF3-16", "r5090-bf3", 1, 115, 248, 123.0, 15.52),
    ("R5090-BF3-32", "r5090-bf3", 2, 308, 389, 806.7, 99.25),
    ("L20-CX7-16", "l20-cx7", 1, 92, 270, 121.3, 11.72),
    ("L20-CX7-32", "l20-cx7", 2, 352, 462, 905.0, 86.94),
]


def _build(preset_name: str, nodes: int, queue: mp.Queue) -> None:
    from variopath_jax.catalog import build_catalog, store
    from variopath_jax.topology import preset

    start = time.perf_counter()
    try:
        cat = build_catalog(preset(preset_name, nodes))
        queue.put(
            {
                "kind": cat.kind,
                "shapes": len(cat.shapes),
                "families": len(cat.families),
                "bytes": len(store.dumps(cat)),
                "seconds": time.perf_counter() - start,
            }
        )
    except Exception as err:  # reported in the table
        queue.put({"error": str(err), "seconds": time.perf_counter() - start})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--limit", type=float, default=60.0, help="seconds per deployment")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = []
    total = time.perf_counter()
    for label, name, nodes, p_shapes, p_fams, p_kib, p_s in DEPLOYMENTS:
        queue: mp.Queue = mp.Queue()
        proc = mp.Process(target=_build, args=(name, nodes, queue))
        proc.start()
        proc.join(args.limit)
        if proc.is_alive():
            proc.terminate()
            proc.join()
            result = {"error": f"over the {args.limit:g} s limit", "seconds": args.limit}
        else:
            result = queue.get()
        rows.append(
            {
                "deployment": label,
                "preset": name,
                "nodes": nodes,
                **result,
                "paper": {"shapes": p_shapes, "families": p_fams, "kib": p_kib, "seconds": p_s},
            }
        )
    elapsed = time.perf_counter() - total
    if args.json:
        print(json.dumps({"rows": rows, "total_seconds": elapsed}))
        return
    print(
        f"{'deployment':<15}{'kind':>9}{'shapes':>9}{'families':>10}{'KiB':>10}{'seconds':>9}   "
        f"{'paper: shapes':>13}{'families':>9}{'KiB':>10}{'seconds':>9}"
    )
    for r in rows:
        p = r["paper"]
        if "error" in r:
            ours = f"{'-':>9}{'-':>9}{'-':>10}{'-':>10}{r['seconds']:>9.2f}"
        else:
            ours = f"{r['kind']:>9}{r['shapes']:>9}{r['families']:>10}{r['bytes'] / 1024:>10.1f}{r['seconds']:>9.2f}"
        print(
            f"{r['deployment']:<15}{ours}   {p['shapes']:>13}{p['families']:>9}{p['kib']:>10.1f}{p['seconds']:>9.2f}"
            + (f"   FAILED: {r['error']}" if "error" in r else "")
        )
    ok = all("error" not in r and r["seconds"] < args.limit for r in rows)
    print(
        f"whole set: {elapsed:.1f} s (goal < 120 s); every deployment under {args.limit:g} s: {ok}"
    )


if __name__ == "__main__":
    main()
