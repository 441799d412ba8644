"""Preset topologies: the paper's Figure 1 and its four platforms, plus common commercial shapes.

The paper (Table 2) gives each platform's GPU, PCIe generation, NIC count and speed, and calls the
PCIe layout "tree" or "ring", but not the wiring. Each preset states the wiring it assumes in its
docstring. Rates are nominal, as the paper's model uses them: PCIe Gen5 x16 = 64 GB/s, Gen4 x16 =
32 GB/s per direction, a NIC = line rate / 8. Shared assumptions of every preset:

- GPU peer-to-peer and GPUDirect RDMA are enabled (the paper's schedules use same-switch PIX and
  cross-switch PXB P2P paths and NIC paths, Figure 1; GeForce cards need the open P2P driver);
- two CPU sockets are joined by an inter-socket link of 64 GB/s per direction
  (``INTER_SOCKET_GBS``; the paper does not say, measured cross-NUMA Gen5 P2P is ~40-56 GB/s);
- NICs attach to a non-blocking fabric;
- each CPU root port is its own root complex (``Device.root_complex`` left empty): the only
  assumption that explains NVIDIA/nccl#1603 (research/trigger-prototype.md), and the safe one
  for the posted-write trigger; no preset below states otherwise;
- the CPU's trigger factor is unmeasured (``Topology.trigger_factor`` None: the network model's
  conservative factor applies) except where a preset of a published machine gives its own.

The last three presets are published machines (research/contention-evidence.md, "The
posted-write collapse"): their wiring and factors come from the pages they cite.
"""

from __future__ import annotations

from collections.abc import Callable

from variopath_jax.errors import TopologyError
from variopath_jax.topology.model import Device, Link, NodeSpec, Topology

INTER_SOCKET_GBS = 64.0


def pcie_gbs(gen: int, width: int = 16) -> float:
    """Nominal per-direction PCIe bandwidth in GB/s (Gen3 x16 = 16, Gen4 = 32, Gen5 = 64)."""
    per_lane = {1: 0.25, 2: 0.5, 3: 1.0, 4: 2.0, 5: 4.0, 6: 8.0, 7: 16.0}
    if gen not in per_lane:
        raise TopologyError(f"unknown PCIe generation {gen}; expected 1..7")
    if width not in (1, 2, 4, 8, 12, 16, 32):
        raise TopologyError(f"unknown PCIe link width x{width}")
    return per_lane[gen] * width


class NodeBuilder:
    """Small helper that names GPUs and NICs in insertion order (gpu0, gpu1, ..., nic0, ...)."""

    def __init__(self) -> None:
        self.devices: list[Device] = []
        self.links: list[Link] = []
        self._counts = {"gpu": 0, "nic": 0}

    def cpu(self, name: str, numa: int) -> str:
        self.devices.append(Device(name, "cpu", numa=numa))
        return name

    def switch(self, name: str, parent: str, gbs: float) -> str:
        self.devices.append(Device(name, "switch", parent, gbs, gbs))
        return name

    def gpu(self, parent: str, gbs: float) -> str:
        name = f"gpu{self._counts['gpu']}"
        self._counts["gpu"] += 1
        self.devices.append(Device(name, "gpu", parent, gbs, gbs))
        return name

    def nic(self, parent: str, gbs: float, gbps: float) -> str:
        name = f"nic{self._counts['nic']}"
        self._counts["nic"] += 1
        self.devices.append(Device(name, "nic", parent, gbs, gbs, nic_gbps=gbps))
        return name

    def link(self, a: str, b: str, gbs: float) -> None:
        self.links.append(Link(a, b, gbs, gbs))

    def build(self) -> NodeSpec:
        return NodeSpec(tuple(self.devices), tuple(self.links))


def _two_sockets(b: NodeBuilder) -> tuple[str, str]:
    cpus = b.cpu("cpu0", 0), b.cpu("cpu1", 1)
    b.link(*cpus, INTER_SOCKET_GBS)
    return cpus


def fig1(nodes: int = 1) -> Topology:
    """The paper's Figure 1: two PCIe switches, each with 3 GPUs and 1 NIC.

    Assumed wiring: both switches hang off one upper switch, so the cross-switch P2P path is PXB
    (the figure's "B") and never touches the CPU; every PCIe link is 64 GB/s and each NIC is
    400 Gb/s (50 GB/s). Cross-switch traffic can also loop through the two NICs and the network
    ("N0"/"N1"). One CPU socket.
    """
    b = NodeBuilder()
    b.cpu("cpu0", 0)
    b.switch("sw", "cpu0", 64.0)
    for sw in ("sw0", "sw1"):
        b.switch(sw, "sw", 64.0)
        for _ in range(3):
            b.gpu(sw, 64.0)
        b.nic(sw, 64.0, 400.0)
    return Topology(b.build(), nodes, name="fig1")


def r5080_bf3(nodes: int = 1) -> Topology:
    """R5080-BF3: 8 RTX 5080 (Gen5 x16) and 4 BlueField-3 400 Gb/s NICs per node, "tree".

    Assumed wiring: per socket one upper switch on a Gen5 x16 root port, below it two leaf
    switches, each with 2 GPUs and 1 NIC (Gen5 x16 links). Same-leaf pairs are PIX, pairs under
    one upper switch PXB, cross-socket pairs SYS. Rank groups: 4 groups of 2 per node.
    """
    b = NodeBuilder()
    for s, cpu in enumerate(_two_sockets(b)):
        top = b.switch(f"top{s}", cpu, 64.0)
        for leaf in range(2):
            sw = b.switch(f"sw{2 * s + leaf}", top, 64.0)
            b.gpu(sw, 64.0)
            b.gpu(sw, 64.0)
            b.nic(sw, 64.0, 400.0)
    return Topology(b.build(), nodes, name="r5080-bf3")


def r5080_cx8(nodes: int = 1) -> Topology:
    """R5080-CX8: 8 RTX 5080 (Gen5 x16) and 4 ConnectX-8 800 Gb/s SuperNICs per node, "tree".

    Assumed wiring, after NVIDIA's MGX PCIe switch board: each ConnectX-8 carries its own PCIe
    Gen6 switch holding 2 GPUs (Gen5 x16) and the NIC function (Gen6 x16 inside the card,
    128 GB/s); each card's switch reaches the host through a Gen5 x16 root port, two cards per
    socket. Cross-card pairs in one socket are PHB, cross-socket SYS. 4 groups of 2 per node.
    """
    b = NodeBuilder()
    for s, cpu in enumerate(_two_sockets(b)):
        for card in range(2):
            sw = b.switch(f"cx{2 * s + card}", cpu, 64.0)
            b.gpu(sw, 64.0)
            b.gpu(sw, 64.0)
            b.nic(sw, 128.0, 800.0)
    return Topology(b.build(), nodes, name="r5080-cx8")


def r5090_bf3(nodes: int = 1) -> Topology:
    """R5090-BF3: 16 RTX 5090 (Gen5 x16) and 8 BlueField-3 400 Gb/s NICs per node, "ring".

    Assumed wiring: four Gen5 switches, each with 4 GPUs and 2 NICs; switches 0-1 on socket 0,
    2-3 on socket 1 (Gen5 x16 uplinks); and switch-to-switch fabric links (Gen5 x16) closing a
    ring 0-1-2-3-0. Peer traffic takes the shortest way round the ring (both ways for opposite
    switches) and never climbs to the CPUs (see ``PathModel``). No public source defines this
    platform's ring; treat the wiring as an assumption. 4 groups of 4 per node.
    """
    b = NodeBuilder()
    cpus = _two_sockets(b)
    switches = [b.switch(f"sw{k}", cpus[k // 2], 64.0) for k in range(4)]
    for sw in switches:
        for _ in range(4):
            b.gpu(sw, 64.0)
        b.nic(sw, 64.0, 400.0)
        b.nic(sw, 64.0, 400.0)
    for k in range(4):
        b.link(switches[k], switches[(k + 1) % 4], 64.0)
    return Topology(b.build(), nodes, name="r5090-bf3")


def l20_cx7(nodes: int = 1) -> Topology:
    """L20-CX7: 16 NVIDIA L20 (Gen4 x16) and 8 ConnectX-7 400 Gb/s NICs per node, "tree".

    Assumed wiring: two Gen4 switches per socket on Gen4 x16 root ports, each with 4 GPUs and
    2 NICs. The NICs sit on Gen4 x16 links (32 GB/s), below their 50 GB/s line rate. Cross-switch
    pairs in one socket are PHB, cross-socket SYS. 4 groups of 4 per node.
    """
    gen4 = pcie_gbs(4)
    b = NodeBuilder()
    for s, cpu in enumerate(_two_sockets(b)):
        for k in range(2):
            sw = b.switch(f"sw{2 * s + k}", cpu, gen4)
            for _ in range(4):
                b.gpu(sw, gen4)
            b.nic(sw, gen4, 400.0)
            b.nic(sw, gen4, 400.0)
    return Topology(b.build(), nodes, name="l20-cx7")


def balanced_8(nodes: int = 1) -> Topology:
    """Dual-root "balanced" server (Supermicro TRT, Inspur Balance Mode): one Gen5 switch per
    socket with 4 GPUs and one 400 Gb/s NIC; cross-switch P2P crosses the sockets (SYS)."""
    b = NodeBuilder()
    for s, cpu in enumerate(_two_sockets(b)):
        sw = b.switch(f"sw{s}", cpu, 64.0)
        for _ in range(4):
            b.gpu(sw, 64.0)
        b.nic(sw, 64.0, 400.0)
    return Topology(b.build(), nodes, name="balanced-8")


def cascade_8(nodes: int = 1) -> Topology:
    """Cascade server (Supermicro TRT3, Inspur Cascade Mode): two Gen5 switches of 4 GPUs and one
    400 Gb/s NIC each, daisy-chained under an upper switch with a single x16 uplink to one CPU;
    cross-switch P2P is PXB and never touches the CPU."""
    b = NodeBuilder()
    b.cpu("cpu0", 0)
    top = b.switch("top", "cpu0", 64.0)
    for k in range(2):
        sw = b.switch(f"sw{k}", top, 64.0)
        for _ in range(4):
            b.gpu(sw, 64.0)
        b.nic(sw, 64.0, 400.0)
    return Topology(b.build(), nodes, name="cascade-8")


def direct_8(nodes: int = 1) -> Topology:
    """Direct-attach server: every GPU and NIC on its own Gen5 x16 CPU root port, 4 GPUs and one
    400 Gb/s NIC per socket. The root complex is modeled as non-blocking, so same-socket pairs
    (PHB) share no link; cross-socket pairs share the inter-socket link (SYS)."""
    b = NodeBuilder()
    for cpu in _two_sockets(b):
        for _ in range(4):
            b.gpu(cpu, 64.0)
        b.nic(cpu, 64.0, 400.0)
    return Topology(b.build(), nodes, name="direct-8")


def root4_gen4(nodes: int = 1) -> Topology:
    """The contention calibration machine of NVIDIA/nccl issue 1603: four RTX 4090 (PCIe Gen4
    x16, 32 GB/s) on root ports of one CPU socket, no PCIe switch, and one NIC.

    Assumed: the NIC is a 200 Gb/s card on its own Gen4 x16 root port (the issue names none);
    the root complex is modeled as non-blocking, as in ``direct-8``, so all its losses come from
    the network model's contention (docs/simulator.md "Calibration"). Every GPU pair is PHB.
    P2P is on as in the issue (a patched driver); ``p2p=False`` gives the host-staged run.
    """
    gen4 = pcie_gbs(4)
    b = NodeBuilder()
    cpu = b.cpu("cpu0", 0)
    for _ in range(4):
        b.gpu(cpu, gen4)
    b.nic(cpu, gen4, 200.0)
    return Topology(b.build(), nodes, name="root4-gen4")


# The posted-write collapse measured on a Threadripper PRO 7955WX (voipmonitor/rtx6kpro,
# hardware/collapse-report.md): 2 pairs from one switch to two destination root complexes 13.5 GB/s,
# 3 pairs to three 12.6, against 52.5 for one pair; the mean of the two ratios.
TRPRO_TRIGGER_FACTOR = (13.5 / 52.5 + 12.6 / 52.5) / 2


def _single_socket_switches(
    name: str, switches: int, gpus: int, nodes: int, factor: float | None
) -> Topology:
    """One socket, ``switches`` Gen5 switches each on its own x16 root port with ``gpus`` Gen5
    x16 GPUs, no NIC (the published builds name none: one node only)."""
    b = NodeBuilder()
    cpu = b.cpu("cpu0", 0)
    for k in range(switches):
        sw = b.switch(f"sw{k}", cpu, 64.0)
        for _ in range(gpus):
            b.gpu(sw, 64.0)
    return Topology(b.build(), nodes, name=name, trigger_factor=factor)


def trpro_4sw(nodes: int = 1) -> Topology:
    """The posted-write collapse machine: a Threadripper PRO 7955WX with four Microchip
    Switchtec PM50100 Gen5 switches, each on its own root complex, four RTX PRO 6000 each
    (GPUs 0-3, 4-7, 8-11, 12-15), no NIC (voipmonitor/rtx6kpro, hardware/collapse-report.md).

    Measured: pushed writes from one switch to two (three) destination root complexes at once
    keep 13.5 (12.6) of 52.5 GB/s; ``trigger_factor`` is the mean of the two ratios (0.249).
    Nominal Gen5 rates; one node only (no NIC).
    """
    return _single_socket_switches("trpro-4sw", 4, 4, nodes, TRPRO_TRIGGER_FACTOR)


def trpro_2sw(nodes: int = 1) -> Topology:
    """The flat two-switch build on the same CPU (voipmonitor/rtx6kpro,
    hardware/wrx90-cpayne-2switch-flat.md): a Threadripper PRO 7955WX, two Gen5 switches on
    their own x16 root ports, four GPUs each (8 GPUs), no NIC.

    Measured: flows sharing one uplink keep 53.4-53.8 GB/s for 1-4 flows and 51.6 for 16 (96%),
    the fit of the network model's root sharing; each uplink only ever writes to the other
    switch's root complex, so the trigger cannot fire here. The CPU's factor is the 4-switch
    build's (same CPU). Nominal Gen5 rates; one node only.
    """
    return _single_socket_switches("trpro-2sw", 2, 4, nodes, TRPRO_TRIGGER_FACTOR)


def turin_pex890(nodes: int = 1) -> Topology:
    """Dual AMD EPYC 9575F with two Broadcom PEX890xx Gen5 switch chips, each split into two
    logical switches of two GPUs on their own x16 root ports, one chip per socket: 8 GPUs, no
    NIC (voipmonitor/rtx6kpro, hardware/asus-esc8000a-e13p-broadcom-switches.md).

    Its measured whole-system all-to-all (p2pmark, 46.4 of an ideal 429.2 GB/s, 0.11) is a
    hold-out the model is checked against, never fitted to. A single-socket build on the same
    CPU ran every trigger pattern at full rate (hardware/asrockrack-genoad24-epyc-cpayne-16gpu.md),
    but the dual-socket build was not measured pattern by pattern: the factor stays unmeasured
    (None), so the network model's conservative factor applies. Nominal Gen5 rates; one node.
    """
    b = NodeBuilder()
    for s, cpu in enumerate(_two_sockets(b)):
        for k in range(2):
            sw = b.switch(f"sw{2 * s + k}", cpu, 64.0)
            b.gpu(sw, 64.0)
            b.gpu(sw, 64.0)
    return Topology(b.build(), nodes, name="turin-pex890")


PRESETS: dict[str, Callable[[int], Topology]] = {
    "fig1": fig1,
    "r5080-cx8": r5080_cx8,
    "r5080-bf3": r5080_bf3,
    "r5090-bf3": r5090_bf3,
    "l20-cx7": l20_cx7,
    "balanced-8": balanced_8,
    "cascade-8": cascade_8,
    "direct-8": direct_8,
    "root4-gen4": root4_gen4,
    "trpro-4sw": trpro_4sw,
    "trpro-2sw": trpro_2sw,
    "turin-pex890": turin_pex890,
}


def preset(name: str, nodes: int = 1) -> Topology:
    """A preset topology by name, replicated to ``nodes`` identical nodes."""
    if name not in PRESETS:
        raise TopologyError(f"unknown preset {name!r}; known presets: {', '.join(PRESETS)}")
    return PRESETS[name](nodes)
