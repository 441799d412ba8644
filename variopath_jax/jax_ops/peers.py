"""Which transport moves the rows between the GPU processes of one host (issue 29).

``cuda-ipc`` maps a peer's device staging into this process's device (``cudaIpcOpenMemHandle``),
which needs the peer's GPU visible here and peer access from this process's GPU to it
(``cudaDeviceCanAccessPeer``): consumer PCIe cards on stock drivers have no P2P, and a launcher
that gives each process its own ``CUDA_VISIBLE_DEVICES`` hides the peers. ``cuda-host`` bounces
the rows through pinned shared host memory and needs neither. ``configure`` runs one round of the
``jax.distributed`` key-value store in which every process reports its own GPUs (UUID, PCI bus
id), the GPUs it sees and which of them its own can access (``report``); ``choose`` then picks
``cuda-ipc`` only where every ordered pair of processes can, else ``cuda-host``, with the reason.
Every process gets the same reports, hence the same choice.
"""

from __future__ import annotations

import itertools
import json
import os

from variopath_jax import _native
from variopath_jax.jax_ops import _compat
from variopath_jax.jax_ops.nccl import kv_get

DEFAULT_BUDGET_FRACTION = 1 / 16  # of the process's device memory: configure's staging_budget
_rounds = itertools.count()  # configure() calls that probed (the same order in every process)


def report(ordinals: list[int]) -> dict:
    """This process's report: its own GPUs (``local``: the UUIDs of CUDA ``ordinals``), every GPU
    it sees (``visible``, with ``bus_ids``), ``access[a]``: the GPUs its GPU ``a`` can access, and
    ``error`` when the probe failed."""
    return report_of(_native.cuda_peers(), ordinals)


def report_of(probe: dict, ordinals: list[int]) -> dict:
    """``report`` from a probe already made (``_native.cuda_peers()``)."""
    out = {"local": [], "visible": [], "bus_ids": {}, "access": {}, "error": probe["error"]}
    devices = probe["devices"]
    if probe["error"]:
        return out
    uuids = [d["uuid"] for d in devices]
    bad = [o for o in ordinals if not 0 <= o < len(uuids)]
    if bad:
        out["error"] = f"CUDA ordinals {bad} are not among the {len(uuids)} GPUs this process sees"
        return out
    out["local"] = [uuids[o] for o in ordinals]
    out["visible"] = uuids
    out["bus_ids"] = {d["uuid"]: d["pci_bus_id"] for d in devices}
    out["access"] = {
        uuids[o]: [u for u, can in zip(uuids, probe["access"][o], strict=True) if can]
        for o in ordinals
    }
    return out


def choose(reports: list[dict]) -> tuple[str, str]:
    """``("cuda-ipc", why)`` when every process sees every other process's GPUs and each of its
    GPUs can access theirs (two processes on one GPU need no peer access), else ``("cuda-host",
    why not)``, naming the first pair that cannot."""
    for p, r in enumerate(reports):
        if r["error"]:
            return "cuda-host", f"process {p} could not probe its GPUs ({r['error']})"
    for p, mine in enumerate(reports):
        for q, theirs in enumerate(reports):
            if p == q:
                continue  # the ranks of one process read each other's staging without a mapping
            for a in mine["local"]:
                for b in theirs["local"]:
                    if a == b:
                        continue
                    bus = theirs["bus_ids"].get(b, "?")
                    if b not in mine["visible"]:
                        return "cuda-host", (
                            f"process {p} does not see process {q}'s GPU {b} (PCI {bus}): "
                            "a CUDA_VISIBLE_DEVICES of its own, or another container"
                        )
                    if b not in mine["access"].get(a, []):
                        return "cuda-host", (
                            f"process {p}'s GPU {a} (PCI {mine['bus_ids'].get(a, '?')}) has no "
                            f"peer access to process {q}'s GPU {b} (PCI {bus}): "
                            "cudaDeviceCanAccessPeer says no (no P2P between them)"
                        )
    return "cuda-ipc", (
        f"every pair of the {len(reports)} processes sees the other's GPUs and has peer access "
        "to them (cudaDeviceCanAccessPeer)"
    )


def gather(ordinals: list[int], timeout_s: float) -> list[dict]:
    """Every process's ``report``, by process index (one key-value round; every process calls
    it, in the same order)."""
    mine = report(ordinals)
    dist = _compat.distributed_client()
    if dist is None:
        return [mine]
    client, me, count = dist
    base = f"variopath_jax/peers/{next(_rounds)}"
    client.key_value_set(f"{base}/{me}", json.dumps(mine))
    return [
        mine
        if p == me
        else json.loads(kv_get(client, f"{base}/{p}", timeout_s, me, f"process {p}'s GPUs"))
        for p in range(count)
    ]


def local_ordinals() -> list[int]:
    """The CUDA ordinals of this process's JAX devices."""
    import jax

    return [
        d.local_hardware_id if d.local_hardware_id is not None else i
        for i, d in enumerate(jax.local_devices())
    ]


def default_budget(platform: str) -> int:
    """``configure``'s default staging budget for this process: DEFAULT_BUDGET_FRACTION of its
    GPUs' memory (together), or of the host's memory for CPU devices."""
    if platform in ("gpu", "cuda"):
        devices = {d["ordinal"]: d["memory"] for d in _native.cuda_peers()["devices"]}
        memory = sum(devices.get(o, 0) for o in local_ordinals())
    else:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return max(1 << 20, int(memory * DEFAULT_BUDGET_FRACTION))


def machine() -> dict:
    """What ``variopath info --json`` reports under ``gpu_peers``: the GPUs this process sees,
    which pairs have peer access, and the transport ``configure`` would pick for one process per
    GPU, each seeing them all as this process does (a launcher that hides GPUs from a process
    makes it ``cuda-host``), with its reason."""
    probe = _native.cuda_peers()
    out = {"devices": probe["devices"], "access": probe["access"], "error": probe["error"]}
    if probe["error"] or len(probe["devices"]) < 2:
        out["transport"], out["reason"] = (
            None,
            (probe["error"] or f"{len(probe['devices'])} GPU(s) here: no pair to connect"),
        )
        return out
    reports = [report_of(probe, [o]) for o in range(len(probe["devices"]))]  # one probe
    out["transport"], out["reason"] = choose(reports)
    return out
