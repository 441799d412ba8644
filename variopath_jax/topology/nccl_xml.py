"""NCCL topology XML (``NCCL_TOPO_DUMP_FILE`` / ``NCCL_TOPO_FILE`` format) into a node.

Format (research/topology-formats.md §2.2): ``<system version="1">`` holding ``<cpu numaid=...>``
elements (NUMA domains), each holding a tree of ``<pci busid class link_speed link_width>``
elements: class ``0x0604xx`` is a switch (represented by its upstream port), a ``pci`` holding
``<gpu dev=... gdr=...>`` is a GPU, one holding ``<nic><net name speed(Mb/s) gdr/></nic>`` is a
NIC. A multi-port card (several ``net`` under one ``nic``) becomes one NIC per port under a
switch standing for the card. NVLink bonds between GPUs (``<nvlink target=busid count=...>``)
become NVLink links; NVSwitch fabrics are out of this library's scope and are ignored.

PCIe rates are nominal (``pcie_gbs``) from the generation the GT/s string names, not NCCL's
de-rated 12/24/48 GB/s; sockets are joined pairwise by ``LinkDefaults.inter_socket_gbs``.

Root complexes: the dump starts each tree at the device below the root port (a switch's upstream
port or an endpoint) and records neither root ports nor root buses (``pci0000:XX``), so it cannot
tell which root ports share a root complex: every root port stays its own (``Device.root_complex``
empty, the model's default and the safe one for the posted-write trigger). Sysfs discovery knows.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

from variopath_jax.errors import ParseError
from variopath_jax.topology.model import Device, Link, NodeSpec, Topology
from variopath_jax.topology.nvsmi import LinkDefaults
from variopath_jax.topology.presets import pcie_gbs

_GEN_OF_GTS = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6, 128.0: 7}


def looks_like_nccl_xml(text: str) -> bool:
    return "<system" in text[:2000]


def _link_gbs(elem: ET.Element, defaults: LinkDefaults, source: str, where: str) -> float:
    speed = (elem.get("link_speed") or "").strip()
    width_text = (elem.get("link_width") or "").strip()
    if not speed:
        gen = defaults.pcie_gen
    else:
        try:
            gts = float(speed.split()[0])
        except ValueError:
            raise ParseError(source, where, f"unreadable link_speed {speed!r}") from None
        if gts not in _GEN_OF_GTS:
            raise ParseError(source, where, f"link_speed {speed!r} is no PCIe generation's rate")
        gen = _GEN_OF_GTS[gts]
    try:
        width = int(width_text) if width_text else defaults.pcie_width
    except ValueError:
        raise ParseError(source, where, f"unreadable link_width {width_text!r}") from None
    if width == 0:  # NCCL reads an unknown width as x16
        width = 16
    return pcie_gbs(gen, width)


def parse(
    text: str, source: str = "nccl xml", defaults: LinkDefaults = LinkDefaults(), nodes: int = 1
) -> Topology:
    """Parse an NCCL topology dump into a topology of ``nodes`` identical nodes."""
    try:
        root = ET.fromstring(text)
    except ET.ParseError as err:
        line, col = err.position
        raise ParseError(source, f"line {line}, column {col}", f"malformed XML: {err}") from None
    if root.tag != "system":
        raise ParseError(source, "root", f"expected <system>, got <{root.tag}>")
    if root.get("version") not in ("1", "2"):
        raise ParseError(source, "system.version", f"unsupported version {root.get('version')!r}")

    devices: list[Device] = []
    gpus: list[tuple[int, Device, str]] = []  # (dev index, device, busid)
    nics: list[Device] = []
    nvlinks: list[tuple[str, str, int]] = []
    gdr_flags: list[bool] = []
    count = {"sw": 0, "nic": 0}

    def walk(elem: ET.Element, parent: str) -> None:
        for child in elem:
            if child.tag == "nic":  # a NIC without a PCI parent hangs off the CPU
                add_nics(child, parent, defaults.pcie, "")
                continue
            if child.tag != "pci":
                continue
            busid = child.get("busid", "?")
            where = f"pci {busid}"
            cls = (child.get("class") or "").lower()
            gbs = _link_gbs(child, defaults, source, where)
            gpu = child.find("gpu")
            nic = child.find("nic")
            if gpu is not None:
                try:
                    dev = int(gpu.get("dev", ""))
                except ValueError:
                    raise ParseError(
                        source, where, f"gpu dev {gpu.get('dev')!r} is not an integer"
                    ) from None
                gdr_flags.append(gpu.get("gdr", "1") == "1")
                gpus.append((dev, Device("", "gpu", parent, gbs, gbs, label=busid), busid))
                for link in gpu.findall("nvlink"):
                    if (link.get("tclass") or "").startswith("0x03"):
                        nvlinks.append((busid, link.get("target", ""), int(link.get("count", "1"))))
            elif nic is not None:
                add_nics(nic, parent, gbs, busid)
            elif cls.startswith("0x0604") or len(child):
                name = f"sw{count['sw']}"
                count["sw"] += 1
                devices.append(Device(name, "switch", parent, gbs, gbs, label=busid))
                walk(child, name)
            elif not cls:
                raise ParseError(source, where, "pci element without a class attribute")

    def add_nics(nic: ET.Element, parent: str, gbs: float, busid: str) -> None:
        nets = nic.findall("net")
        if not nets:
            raise ParseError(
                source, f"nic {busid or 'under ' + parent}", "a <nic> without <net> ports"
            )
        holder = parent
        if len(nets) > 1:
            holder = f"sw{count['sw']}"
            count["sw"] += 1
            devices.append(Device(holder, "switch", parent, gbs, gbs, label=busid))
        for net in nets:
            name = net.get("name", "?")
            speed = net.get("speed")
            try:
                gbps = float(speed) / 1000.0 if speed else defaults.nic_gbps
            except ValueError:
                raise ParseError(
                    source, f"net {name}", f"speed {speed!r} is not a number (Mb/s)"
                ) from None
            if gbps <= 0:
                raise ParseError(source, f"net {name}", f"speed must be > 0 Mb/s, got {speed}")
            gdr_flags.append(net.get("gdr", "1") == "1")
            nics.append(
                Device(f"nic{count['nic']}", "nic", holder, gbs, gbs, nic_gbps=gbps, label=name)
            )
            count["nic"] += 1

    cpus = sorted(root.findall("cpu"), key=lambda c: int(c.get("numaid", "-1") or -1))
    if not cpus:
        raise ParseError(source, "system", "no <cpu> elements")
    for k, cpu in enumerate(cpus):
        numaid = cpu.get("numaid", str(k))
        try:
            numa = int(numaid)
        except ValueError:
            raise ParseError(source, f"cpu {k}", f"numaid {numaid!r} is not an integer") from None
        name = f"cpu{k}"
        devices.append(Device(name, "cpu", numa=numa if numa >= 0 else k))
        walk(cpu, name)
    if not gpus:
        raise ParseError(source, "system", "no <gpu> elements: the dump holds no GPU")
    gpus.sort(key=lambda g: g[0])
    busid_to_name = {}
    for rank, (_, dev, busid) in enumerate(gpus):
        name = f"gpu{rank}"
        busid_to_name[busid] = name
        devices.append(Device(name, "gpu", dev.parent, dev.up_gbs, dev.down_gbs, label=busid))
    devices += nics
    cpu_names = [d.name for d in devices if d.kind == "cpu"]
    links = [
        Link(a, b, defaults.inter_socket_gbs, defaults.inter_socket_gbs)
        for i, a in enumerate(cpu_names)
        for b in cpu_names[i + 1 :]
    ]
    bonds: dict[tuple[str, str], int] = {}
    for src, dst, n in nvlinks:
        if dst in busid_to_name:
            pair = tuple(sorted((busid_to_name[src], busid_to_name[dst])))
            bonds[pair] = max(bonds.get(pair, 0), n)
    links += [
        Link(a, b, n * defaults.nvlink_gbs, n * defaults.nvlink_gbs, n)
        for (a, b), n in sorted(bonds.items())
    ]
    try:
        node = NodeSpec(tuple(devices), tuple(links))
        return Topology(node, nodes, gdr=all(gdr_flags), name=source)
    except ParseError:
        raise
    except Exception as err:
        raise ParseError(source, "", str(err)) from None
