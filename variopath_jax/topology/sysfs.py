"""Discover this machine's node from Linux sysfs (``/sys/bus/pci/devices``).

Follows NCCL's bottom-up walk (research/topology-formats.md §3.3): a device's canonical path
``/sys/devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0/0000:18:00.0`` runs root bus,
root port, switch upstream port, switch downstream port, device; a device's parent is the path
component two levels up (the switch's upstream port), or the root bus when that is not a PCI
address. Root buses of one NUMA node with more than one bus become separate host bridges (so
PHB and NODE stay apart). The root bus (``pci0000:15``, domain and bus) is the root complex: the
device on each root port below it gets ``root_complex="pci0000:15"``, so root ports of one root
bus share a root complex and those of different root buses do not (the posted-write trigger's
granularity: research/contention-evidence.md). A link's rate is the nominal rate of
min(device, upstream port) ``max_link_speed`` and ``max_link_width``. GPUs are NVIDIA display or
3D controllers (vendor 0x10de, class 0x03xxxx); NICs are the PCI functions behind
``/sys/class/infiniband``, with their line rate from the port's ``rate`` file.
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

from variopath_jax.errors import TopologyError
from variopath_jax.topology.model import Device, Link, NodeSpec, Topology
from variopath_jax.topology.nvsmi import LinkDefaults
from variopath_jax.topology.presets import pcie_gbs

_BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_GEN_OF_GTS = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6, 128.0: 7}


def _read(path: Path, default: str = "") -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return default


def _link(
    dev: Path, port: Path | None, defaults: LinkDefaults, unread: list[str] | None = None
) -> float:
    """Nominal rate of the link between a device and the port in front of it; where sysfs
    gives no speed, ``defaults``' generation, and ``unread`` gets the device's address."""
    gens, widths = [], []
    for p in (dev, port):
        if p is None:
            continue
        speed = _read(p / "max_link_speed")
        width = _read(p / "max_link_width")
        with contextlib.suppress(ValueError, IndexError, KeyError):
            gens.append(_GEN_OF_GTS[float(speed.split()[0])])
        if width.isdigit() and int(width) > 0:
            widths.append(int(width))
    gen = min(gens) if gens else defaults.pcie_gen
    if not gens and unread is not None:
        unread.append(dev.name)
    width = min(widths) if widths else defaults.pcie_width
    return pcie_gbs(gen, width)


def _rdma_nics(sys_root: Path) -> dict[str, tuple[str, float]]:
    """PCI address -> (RDMA device name, line rate Gb/s) for every RDMA device."""
    out: dict[str, tuple[str, float]] = {}
    ib = sys_root / "class" / "infiniband"
    if not ib.is_dir():
        return out
    for entry in sorted(ib.iterdir()):
        bdf = Path(os.path.realpath(entry / "device")).name
        rate = 0.0
        ports = entry / "ports"
        if ports.is_dir():
            for port in sorted(ports.iterdir()):
                text = _read(port / "rate")  # e.g. "400 Gb/sec (4X NDR)"
                if text.split()[:1] and text.split()[0].replace(".", "", 1).isdigit():
                    rate += float(text.split()[0])
        out[bdf] = (entry.name, rate)
    return out


def discover(
    sys_root: str | Path = "/sys",
    defaults: LinkDefaults = LinkDefaults(),
    nodes: int = 1,
    unread: list[str] | None = None,
) -> Topology:
    """Build this machine's node from sysfs; raise a clear error when it has no NVIDIA GPU.
    ``unread``, when given, receives the PCI addresses whose link speed sysfs did not give
    (rated at ``defaults``' generation)."""
    sys_root = Path(sys_root)
    pci = sys_root / "bus" / "pci" / "devices"
    if not pci.is_dir():
        raise TopologyError(
            f"sysfs discovery: {pci} does not exist (not Linux, or sysfs not mounted)"
        )
    entries = sorted(pci.iterdir())
    rdma = _rdma_nics(sys_root)
    wanted: dict[str, tuple[str, Path, list[str]]] = {}  # bdf -> (kind, sysfs dir, path components)
    for entry in entries:
        real = Path(os.path.realpath(entry))
        vendor = _read(entry / "vendor").lower()
        cls = _read(entry / "class").lower()
        kind = None
        if vendor == "0x10de" and cls.startswith("0x03"):
            kind = "gpu"
        elif entry.name in rdma:
            kind = "nic"
        if kind:
            comps = _components(real)
            if comps is None:
                raise TopologyError(
                    f"sysfs discovery: cannot read the PCI path of {entry.name} ({real})"
                )
            wanted[entry.name] = (kind, real, comps)
    if not any(kind == "gpu" for kind, _, _ in wanted.values()):
        raise TopologyError(
            f"sysfs discovery: no NVIDIA GPU (vendor 0x10de, class 0x03xxxx) among the {len(entries)} "
            f"PCI devices under {pci}; use a preset, a spec file, `nvidia-smi topo -m` text or an NCCL "
            "topology dump instead"
        )

    devices: dict[str, Device] = {}
    order: list[str] = []
    numa_of_root: dict[str, int] = {}
    root_buses: dict[int, list[str]] = {}
    switch_names: dict[str, str] = {}

    def numa_of(path: Path) -> int:
        value = _read(path / "numa_node", "-1")
        return int(value) if value.lstrip("-").isdigit() and int(value) >= 0 else 0

    def parent_of(comps: list[str], idx: int, real_prefix: Path) -> str:
        """Name of the parent of the component at ``idx`` (creating switches on the way)."""
        if idx >= 2 and _BDF.match(comps[idx - 2]):
            usp = comps[idx - 2]
            if usp not in switch_names:
                usp_path = real_prefix.joinpath(*comps[1 : idx - 1])
                port = real_prefix.joinpath(*comps[1 : idx - 2]) if idx - 3 >= 1 else None
                grand = parent_of(comps, idx - 2, real_prefix)
                name = f"sw{len(switch_names)}"
                switch_names[usp] = name
                gbs = _link(usp_path, port, defaults, unread)
                devices[name] = Device(name, "switch", grand, gbs, gbs, label=usp)
                order.append(name)
            return switch_names[usp]
        root = comps[0]
        if root not in numa_of_root:
            numa = numa_of(real_prefix.joinpath(*comps[1 : idx + 1]))
            numa_of_root[root] = numa
            root_buses.setdefault(numa, []).append(root)
        return f"root:{root}"

    leaves = []
    for bdf, (kind, real, comps) in sorted(wanted.items()):
        prefix = real
        for _ in range(len(comps) - 1):
            prefix = prefix.parent
        idx = len(comps) - 1
        parent = parent_of(comps, idx, prefix)
        port = prefix.joinpath(*comps[1:idx]) if idx >= 2 else None
        gbs = _link(real, port, defaults, unread)
        if kind == "nic":
            name, rate = rdma[bdf]
            leaves.append(
                Device(bdf, "nic", parent, gbs, gbs, nic_gbps=rate or defaults.nic_gbps, label=name)
            )
        else:
            leaves.append(Device(bdf, "gpu", parent, gbs, gbs, label=bdf))

    # Sockets (NUMA nodes) and host bridges.
    final: list[Device] = []
    root_parent: dict[str, str] = {}
    numas = sorted(root_buses)
    for s, numa in enumerate(numas):
        cpu = f"cpu{s}"
        final.append(Device(cpu, "cpu", numa=numa))
        buses = root_buses[numa]
        for b, bus in enumerate(buses):
            if len(buses) == 1:
                root_parent[f"root:{bus}"] = cpu
            else:
                hb = f"hb{s}.{b}"
                final.append(
                    Device(
                        hb,
                        "hostbridge",
                        cpu,
                        defaults.host_bridge_gbs,
                        defaults.host_bridge_gbs,
                        label=bus,
                    )
                )
                root_parent[f"root:{bus}"] = hb

    def fix(dev: Device, name: str | None = None) -> Device:
        parent = root_parent.get(dev.parent, dev.parent)
        # A device straight below a root bus sits on a root port of that root complex.
        on_root = dev.parent is not None and dev.parent.startswith("root:")
        return Device(
            name or dev.name,
            dev.kind,
            parent,
            dev.up_gbs,
            dev.down_gbs,
            dev.nic_gbps,
            dev.numa,
            dev.label,
            root_complex=f"pci{dev.parent[5:]}" if on_root else "",
        )

    final += [fix(devices[n]) for n in order]
    gpu_leaves = [d for d in leaves if d.kind == "gpu"]
    nic_leaves = [d for d in leaves if d.kind == "nic"]
    final += [fix(d, f"gpu{i}") for i, d in enumerate(gpu_leaves)]
    final += [fix(d, f"nic{i}") for i, d in enumerate(nic_leaves)]
    cpus = [d.name for d in final if d.kind == "cpu"]
    links = [
        Link(a, b, defaults.inter_socket_gbs, defaults.inter_socket_gbs)
        for i, a in enumerate(cpus)
        for b in cpus[i + 1 :]
    ]
    return Topology(NodeSpec(tuple(final), tuple(links)), nodes, name="sysfs")


def _components(real: Path) -> list[str] | None:
    """``[root bus, bdf, bdf, ...]`` from a canonical device path, or None."""
    parts = real.parts
    for i, part in enumerate(parts):
        if part.startswith("pci") and ":" in part:
            comps = [part[3:]] + [p for p in parts[i + 1 :]]
            if all(_BDF.match(c) for c in comps[1:]):
                return comps
            return None
    return None
