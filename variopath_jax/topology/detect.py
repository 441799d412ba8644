"""This machine's topology, for ``variopath topo detect`` and ``configure()`` on GPUs.

The tree, the link rates and the NICs come from sysfs (:mod:`sysfs`). What sysfs does not say is
read or probed, never assumed:

- link generation: sysfs ``max_link_speed``; where a device has none, ``nvidia-smi
  --query-gpu=pci.bus_id,pcie.link.gen.max,pcie.link.width.max`` (the slowest GPU rates those
  links), else the caller's ``pcie_gen``, else an error asking for it;
- GPU peer-to-peer: the CUDA probe (``cudaDeviceCanAccessPeer`` between every pair of this
  process's GPUs, ``_native.cuda_peers``), else ``nvidia-smi topo -p2p r``, else the caller's
  ``p2p``, else an error asking for it; on when every pair has it;
- GPUDirect RDMA (only where the node has NICs): the ``nvidia_peermem`` (or ``nv_peer_mem``)
  kernel module under ``/sys/module``, or the caller's ``gdr``.

A machine without NVIDIA GPUs is an error that says so.
"""

from __future__ import annotations

import dataclasses
import shutil
import socket
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from variopath_jax.errors import TopologyError
from variopath_jax.topology import nvsmi, sysfs
from variopath_jax.topology.model import Topology
from variopath_jax.topology.nvsmi import LinkDefaults

GPU_QUERY = ("--query-gpu=pci.bus_id,pcie.link.gen.max,pcie.link.width.max", "--format=csv")
P2P_QUERY = ("topo", "-p2p", "r")
PEERMEM_MODULES = ("nvidia_peermem", "nv_peer_mem")


def run_nvidia_smi(args: tuple[str, ...], timeout_s: float = 30.0) -> str | None:
    """``nvidia-smi ARGS``'s output, or None where it is not installed or fails."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        proc = subprocess.run(
            [exe, *args], capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 and proc.stdout.strip() else None


def cuda_probe() -> dict:
    """``_native.cuda_peers()``: this process's GPUs and which can access which (its ``error``
    says why not where CUDA is missing)."""
    try:
        from variopath_jax import _native

        return _native.cuda_peers()
    except Exception as err:  # the native module missing or failing: no probe
        return {"error": str(err), "devices": [], "access": []}


@dataclass(frozen=True)
class Detection:
    """A detected node and how each fact about it was known."""

    topology: Topology
    links: str  # where the link generations came from
    p2p: str  # where P2P came from
    gdr: str  # where GPUDirect RDMA came from
    notes: tuple[str, ...] = ()


def detect(
    sys_root: str | Path = "/sys",
    *,
    nodes: int = 1,
    pcie_gen: int | None = None,
    p2p: bool | None = None,
    gdr: bool | None = None,
    nvidia_smi: Callable[[tuple[str, ...]], str | None] = run_nvidia_smi,
    probe: Callable[[], dict] = cuda_probe,
) -> Detection:
    """This machine's node (``nodes`` copies of it), every fact read or probed (module
    docstring); a clear ``TopologyError`` where a fact cannot be known and was not given."""
    sys_root = Path(sys_root)
    notes: list[str] = []
    unread: list[str] = []
    defaults = LinkDefaults() if pcie_gen is None else LinkDefaults(pcie_gen=pcie_gen)
    try:
        topo = sysfs.discover(sys_root, defaults, unread=unread)
    except TopologyError as err:
        if "no NVIDIA GPU" in str(err):
            raise TopologyError(
                f"topo detect: this machine has no NVIDIA GPU, so there is nothing to detect "
                f"({err}); run it on the GPU machine you plan for"
            ) from None
        raise TopologyError(f"topo detect: {err}") from None
    links = "sysfs (max_link_speed, max_link_width)"
    if unread and pcie_gen is not None:
        links += f"; --pcie-gen {pcie_gen} for the {len(unread)} link(s) sysfs gives no speed"
    elif unread:
        text = nvidia_smi(GPU_QUERY)
        rows = nvsmi.split_extras(text)[1].links if text else ()
        if not rows:
            raise TopologyError(
                f"topo detect: sysfs gives no link speed for {len(unread)} device(s) "
                f"({', '.join(unread[:3])}{', ...' if len(unread) > 3 else ''}) and nvidia-smi "
                "gives no pcie.link.gen.max to read instead; pass the generation (--pcie-gen N, "
                "pcie_gen=N)"
            )
        gen, width = min(g for _, g, _ in rows), min(w for _, _, w in rows)
        unread.clear()
        topo = sysfs.discover(sys_root, LinkDefaults(pcie_gen=gen, pcie_width=width))
        links += (
            f"; nvidia-smi's pcie.link.gen.max (Gen{gen} x{width}, the slowest GPU) for the "
            "links sysfs gives no speed"
        )
    p2p_on, p2p_source = _p2p(topo, p2p, nvidia_smi, probe, notes)
    gdr_on, gdr_source = _gdr(topo, sys_root, gdr)
    topo = dataclasses.replace(
        topo,
        nodes=nodes,
        p2p=p2p_on,
        gdr=gdr_on,
        name=socket.gethostname() or "this-machine",
        _graph_cache={},
    )
    return Detection(topo, links, p2p_source, gdr_source, tuple(notes))


def _p2p(
    topo: Topology,
    given: bool | None,
    nvidia_smi: Callable[[tuple[str, ...]], str | None],
    probe: Callable[[], dict],
    notes: list[str],
) -> tuple[bool, str]:
    gpus = [d.label.lower() for d in topo.node.gpus]  # PCI addresses, in sysfs order
    if given is not None:
        return given, f"given ({'--p2p' if given else '--no-p2p'})"
    if len(gpus) == 1:
        return True, "one GPU: no GPU pair to move data between"
    found = probe()
    if not found.get("error") and len(found.get("devices", [])) >= 2:
        bus = [_bus_id(d["pci_bus_id"]) for d in found["devices"]]
        seen = [i for i, b in enumerate(bus) if b in gpus]
        if len(seen) >= 2:
            if len(seen) < len(gpus):
                notes.append(
                    f"CUDA sees {len(seen)} of the {len(gpus)} GPUs (CUDA_VISIBLE_DEVICES?): "
                    "P2P was probed between those"
                )
            blocked = [
                (bus[a], bus[b]) for a in seen for b in seen if a != b and not found["access"][a][b]
            ]
            if blocked:
                notes.append(
                    f"no peer access between {len(blocked)} GPU pair(s) (first: {blocked[0][0]} "
                    f"-> {blocked[0][1]}): GPU-to-GPU traffic goes through host memory"
                )
            return not blocked, "CUDA probe (cudaDeviceCanAccessPeer between every GPU pair)"
    text = nvidia_smi(P2P_QUERY)
    status = nvsmi.split_extras(text)[1].p2p if text else None
    if status:
        pairs = [(a, b) for a in range(len(gpus)) for b in range(len(gpus)) if a != b]
        if any(p not in status for p in pairs):
            raise TopologyError(
                f"topo detect: nvidia-smi topo -p2p r covers other GPUs than the {len(gpus)} "
                "sysfs finds; pass --p2p or --no-p2p"
            )
        blocked = [p for p in pairs if status[p] != "OK"]
        if blocked:
            a, b = blocked[0]
            notes.append(
                f"nvidia-smi reports no P2P read between {len(blocked)} GPU pair(s) (first: GPU{a}"
                f"/GPU{b} {status[(a, b)]}): GPU-to-GPU traffic goes through host memory"
            )
        return not blocked, "nvidia-smi topo -p2p r"
    why = found.get("error") or "it sees fewer than two of the GPUs"
    raise TopologyError(
        "topo detect: cannot tell whether the GPUs have peer-to-peer access: the CUDA probe "
        f"failed ({why}) and nvidia-smi topo -p2p r gave nothing; pass --p2p or --no-p2p"
    )


def _bus_id(text: str) -> str:
    """A PCI address as sysfs names it (``0000:18:00.0``; CUDA may print 8 domain digits)."""
    domain, rest = text.lower().split(":", 1)
    return f"{int(domain, 16):04x}:{rest}"


def _gdr(topo: Topology, sys_root: Path, given: bool | None) -> tuple[bool, str]:
    if given is not None:
        return given, f"given ({'--gdr' if given else '--no-gdr'})"
    if not topo.node.nics:
        return True, "no NICs: nothing to decide"
    for module in PEERMEM_MODULES:
        if (sys_root / "module" / module).is_dir():
            return True, f"the {module} kernel module is loaded"
    return False, (
        f"none of the {', '.join(PEERMEM_MODULES)} kernel modules is loaded, so NIC traffic is "
        "staged through host memory (a dma-buf GPUDirect stack needs no module: pass --gdr)"
    )
