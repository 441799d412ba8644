"""The topology model every part of variopath_jax agrees on (DESIGN.md, "The model").

A node is a tree of devices: CPU sockets (NUMA nodes) at the roots, optional host bridges
(root complexes) under a socket, PCIe switches (cascades allowed), and GPUs and NICs as leaves.
Every tree edge is a physical link with a capacity per direction. Extra links join sockets (the
inter-socket interconnect), switches (switch-to-switch fabric links, e.g. a ring) or GPUs (NVLink
bridges). A topology is ``nodes`` identical copies of one node whose NICs attach to a network
fabric: non-blocking by default, or oversubscribed at each node's uplink.

Units: GB/s (1e9 B/s) for capacities, Gb/s only for NIC line rates as vendors quote them.
Ranks are the GPUs, numbered node-major: rank = node * gpus_per_node + local index, local index
being the order of the GPUs in the node's device list.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from functools import cached_property
from itertools import pairwise

from variopath_jax.errors import TopologyError

DEVICE_KINDS = ("cpu", "hostbridge", "switch", "gpu", "nic")
# Which kinds may be the tree parent of which.
_PARENT_KINDS = {
    "cpu": (),
    "hostbridge": ("cpu",),
    "switch": ("cpu", "hostbridge", "switch"),
    "gpu": ("cpu", "hostbridge", "switch"),
    "nic": ("cpu", "hostbridge", "switch"),
}
# The kinds a root port hangs off: a device whose parent is one of these sits on a CPU root port.
_ROOT_KINDS = ("cpu", "hostbridge")
# Extra (non-tree) links and the device kinds they join.
LINK_KINDS = {("cpu", "cpu"): "socket", ("switch", "switch"): "fabric", ("gpu", "gpu"): "nvlink"}

# nvidia-smi topo -m relation classes, nearest first.
RELATION_ORDER = ("PIX", "PXB", "PHB", "NODE", "SYS")


@dataclass(frozen=True)
class Device:
    """One device of a node.

    Attributes
    ----------
    name : str
        Unique within the node (``gpu0``, ``sw1``, ...).
    kind : str
        One of ``cpu``, ``hostbridge``, ``switch``, ``gpu``, ``nic``.
    parent : str or None
        Tree parent; ``None`` exactly for CPU sockets.
    up_gbs, down_gbs : float
        Capacity of the link to the parent, device→parent and parent→device.
    nic_gbps : float
        Line rate of a NIC in Gb/s (0 for other kinds).
    numa : int or None
        NUMA id of a CPU socket.
    label : str
        Cosmetic: a PCI bus id or an RDMA device name; not part of the fingerprint.
    root_complex : str
        Only for a device on a CPU root port (its parent a ``cpu`` or ``hostbridge``): the CPU
        root complex that port belongs to (sysfs: the top-level ``pci0000:XX`` bus; on an AMD
        I/O die, a quadrant). Empty: the port is its own root complex, the assumption that fits
        NVIDIA/nccl#1603 and the safe one for the posted-write trigger (DESIGN.md "Network
        model"; research/contention-evidence.md "The posted-write collapse").
    """

    name: str
    kind: str
    parent: str | None = None
    up_gbs: float = 0.0
    down_gbs: float = 0.0
    nic_gbps: float = 0.0
    numa: int | None = None
    label: str = ""
    root_complex: str = ""


@dataclass(frozen=True)
class Link:
    """An extra bidirectional link between two devices of a node (not a tree edge)."""

    a: str
    b: str
    ab_gbs: float
    ba_gbs: float
    count: int = (
        1  # bonded physical links (an NVLink bond of ``count`` links); capacities are totals
    )


@dataclass(frozen=True)
class NodeSpec:
    """The devices and extra links of one node, validated on construction."""

    devices: tuple[Device, ...]
    links: tuple[Link, ...] = ()

    def __post_init__(self) -> None:
        _validate_node(self)

    @cached_property
    def by_name(self) -> dict[str, Device]:
        return {d.name: d for d in self.devices}

    def of_kind(self, kind: str) -> tuple[Device, ...]:
        return tuple(d for d in self.devices if d.kind == kind)

    @cached_property
    def gpus(self) -> tuple[Device, ...]:
        return self.of_kind("gpu")

    @cached_property
    def nics(self) -> tuple[Device, ...]:
        return self.of_kind("nic")

    def ancestors(self, name: str) -> list[str]:
        """Tree ancestors of a device, nearest first, ending at its socket."""
        chain = []
        parent = self.by_name[name].parent
        while parent is not None:
            chain.append(parent)
            parent = self.by_name[parent].parent
        return chain

    def socket_of(self, name: str) -> str:
        chain = self.ancestors(name)
        return chain[-1] if chain else name

    def root_port_of(self, name: str) -> str | None:
        """The device on the CPU root port above ``name`` (``name`` itself when it sits on one),
        or None for a socket or host bridge."""
        if self.by_name[name].kind in ("cpu", "hostbridge"):
            return None
        chain = [name, *self.ancestors(name)]
        return next(v for v, up in pairwise(chain) if self.by_name[up].kind in _ROOT_KINDS)

    def root_complex_of(self, name: str) -> str:
        """The root complex of the root port above ``name``: its ``root_complex`` or, where
        nothing says otherwise, the port itself (named after the device on it)."""
        port = self.root_port_of(name)
        if port is None:
            raise TopologyError(f"{name!r} is a {self.by_name[name].kind}, not on a root port")
        return self.by_name[port].root_complex or port

    @cached_property
    def root_complexes(self) -> tuple[str, ...]:
        """The node's root complexes, in the order their first root port appears."""
        return tuple(
            dict.fromkeys(
                self.root_complex_of(d.name)
                for d in self.devices
                if d.kind not in _ROOT_KINDS  # a host bridge hangs off its socket, on no port
                and d.parent is not None
                and self.by_name[d.parent].kind in _ROOT_KINDS
            )
        )

    def relation(self, a: str, b: str) -> str:
        """The ``nvidia-smi topo -m`` class between two devices of this node.

        PIX: same parent switch; PXB: lowest common ancestor is a switch; PHB: it is a host
        bridge, or the socket with both sides attached to the socket's own root complex; NODE:
        the socket, with at least one side below a separate host bridge; SYS: different sockets.
        NVLink bridges are reported as ``NV#`` by :func:`render_relation`, not here.
        """
        if a == b:
            return "X"
        chain_a = [a, *self.ancestors(a)]
        chain_b = [b, *self.ancestors(b)]
        if chain_a[-1] != chain_b[-1]:
            return "SYS"
        in_b = set(chain_b)
        lca = next(v for v in chain_a if v in in_b)
        kind = self.by_name[lca].kind
        if kind == "switch":
            same_parent = self.by_name[a].parent == self.by_name[b].parent == lca
            return "PIX" if same_parent else "PXB"
        if kind == "hostbridge":
            return "PHB"
        # The lowest common ancestor is the socket itself.
        below_hb = any(self.by_name[chain[-2]].kind == "hostbridge" for chain in (chain_a, chain_b))
        return "NODE" if below_hb else "PHB"

    def nvlinks(self, a: str, b: str) -> int:
        """Number of bonded NVLinks between two GPUs (0 when none)."""
        return sum(
            lk.count
            for lk in self.links
            if {lk.a, lk.b} == {a, b} and _kind_of_link(self, lk) == "nvlink"
        )


def _kind_of_link(node: NodeSpec, link: Link) -> str:
    kinds = (node.by_name[link.a].kind, node.by_name[link.b].kind)
    return LINK_KINDS[kinds]


def _validate_node(node: NodeSpec) -> None:
    names: dict[str, Device] = {}
    for i, dev in enumerate(node.devices):
        where = f"device {i} ({dev.name!r})"
        if not dev.name or "/" in dev.name:
            raise TopologyError(f"{where}: name must be non-empty and contain no '/'")
        if dev.name in names:
            raise TopologyError(f"{where}: duplicate device name")
        if dev.kind not in DEVICE_KINDS:
            raise TopologyError(
                f"{where}: unknown kind {dev.kind!r}; expected one of {DEVICE_KINDS}"
            )
        names[dev.name] = dev
    for i, dev in enumerate(node.devices):
        where = f"device {i} ({dev.name!r})"
        if dev.root_complex and dev.kind in _ROOT_KINDS:
            raise TopologyError(
                f"{where}: root_complex {dev.root_complex!r} is only for a device on a CPU root "
                f"port, not a {dev.kind}"
            )
        if dev.kind == "cpu":
            if dev.parent is not None:
                raise TopologyError(f"{where}: a cpu socket has no parent")
            continue
        if dev.parent is None:
            raise TopologyError(f"{where}: a {dev.kind} needs a parent")
        if dev.parent not in names:
            raise TopologyError(f"{where}: parent {dev.parent!r} does not exist")
        pkind = names[dev.parent].kind
        if pkind not in _PARENT_KINDS[dev.kind]:
            raise TopologyError(f"{where}: a {dev.kind} cannot hang off a {pkind} ({dev.parent!r})")
        for field_name in ("up_gbs", "down_gbs"):
            value = getattr(dev, field_name)
            if not value > 0:
                raise TopologyError(f"{where}: {field_name} must be > 0 GB/s, got {value}")
        if dev.kind == "nic" and not dev.nic_gbps > 0:
            raise TopologyError(f"{where}: nic_gbps must be > 0 Gb/s, got {dev.nic_gbps}")
        if dev.root_complex and pkind not in _ROOT_KINDS:
            raise TopologyError(
                f"{where}: root_complex {dev.root_complex!r} is only for a device on a CPU root "
                f"port (its parent a cpu or hostbridge), not below a {pkind} ({dev.parent!r})"
            )
    # Parent chains must end at a socket (no cycles).
    for dev in node.devices:
        seen = {dev.name}
        parent = dev.parent
        while parent is not None:
            if parent in seen:
                raise TopologyError(
                    f"device {dev.name!r}: parent chain has a cycle through {parent!r}"
                )
            seen.add(parent)
            parent = names[parent].parent
    if not any(d.kind == "gpu" for d in node.devices):
        raise TopologyError("the node has no GPUs")
    for i, lk in enumerate(node.links):
        where = f"link {i} ({lk.a!r}-{lk.b!r})"
        for end in (lk.a, lk.b):
            if end not in names:
                raise TopologyError(f"{where}: device {end!r} does not exist")
        if lk.a == lk.b:
            raise TopologyError(f"{where}: a link joins two different devices")
        kinds = (names[lk.a].kind, names[lk.b].kind)
        if kinds not in LINK_KINDS:
            raise TopologyError(
                f"{where}: extra links join cpu-cpu, switch-switch or gpu-gpu, not {kinds[0]}-{kinds[1]}"
            )
        for field_name in ("ab_gbs", "ba_gbs"):
            value = getattr(lk, field_name)
            if not value > 0:
                raise TopologyError(f"{where}: {field_name} must be > 0 GB/s, got {value}")
        if not (isinstance(lk.count, int) and lk.count >= 1):
            raise TopologyError(f"{where}: count must be a positive integer, got {lk.count!r}")


@dataclass(frozen=True)
class DirectedLink:
    """One direction of a physical link in the expanded multi-node graph."""

    index: int
    src: int  # vertex index
    dst: int
    gbs: float
    kind: str  # "pcie", "socket", "fabric", "nvlink", "nic" (NIC to network), "uplink" (node to spine)


@dataclass(frozen=True)
class Topology:
    """A multi-node PCIe topology: ``nodes`` copies of ``node`` joined by a network fabric.

    Attributes
    ----------
    node : NodeSpec
        The devices of one node; every node is identical.
    nodes : int
        Number of nodes.
    p2p : bool
        GPU peer-to-peer allowed; when not, GPU↔GPU traffic bounces through host memory.
    gdr : bool
        GPUDirect RDMA allowed; when not, NIC traffic is staged through host memory.
    oversubscription : float
        1.0 is a non-blocking fabric. Above 1, each node reaches the spine through one uplink of
        (sum of its NIC line rates) / oversubscription per direction.
    name : str
        A label (preset name or file name); not part of the fingerprint.
    trigger_factor : float or None
        The measured fraction of its capacity a root-port uplink keeps while pushed P2P writes
        on it target two or more root complexes (the posted-write trigger, a property of the
        CPU: research/contention-evidence.md); None where nobody measured it, and the network
        model's conservative factor applies (sim/network.py).
    assumed : tuple of str
        What the source did not say and was assumed, each in words (``nvidia-smi topo -m`` text
        gives neither the PCIe generation nor P2P); empty when nothing was. Not part of the
        fingerprint; a spec file keeps it.
    """

    node: NodeSpec
    nodes: int = 1
    p2p: bool = True
    gdr: bool = True
    oversubscription: float = 1.0
    name: str = "custom"
    trigger_factor: float | None = None
    assumed: tuple[str, ...] = field(default=(), compare=False)
    _graph_cache: dict = field(default_factory=dict, compare=False, repr=False, hash=False)

    def __post_init__(self) -> None:
        if not isinstance(self.nodes, int) or self.nodes < 1:
            raise TopologyError(f"nodes must be a positive integer, got {self.nodes!r}")
        if not self.oversubscription >= 1.0:
            raise TopologyError(f"oversubscription must be >= 1.0, got {self.oversubscription}")
        if self.nodes > 1 and not self.node.nics:
            raise TopologyError("a multi-node topology needs at least one NIC per node")
        factor = self.trigger_factor
        if factor is not None and not (
            isinstance(factor, int | float) and not isinstance(factor, bool) and 0 < factor <= 1
        ):
            raise TopologyError(f"trigger_factor must be in (0, 1] or None, got {factor!r}")

    # ----- sizes -------------------------------------------------------------------------
    @property
    def gpus_per_node(self) -> int:
        return len(self.node.gpus)

    @property
    def nics_per_node(self) -> int:
        return len(self.node.nics)

    @property
    def num_ranks(self) -> int:
        return self.nodes * self.gpus_per_node

    def with_nodes(self, nodes: int) -> Topology:
        """The same node type replicated ``nodes`` times."""
        return dataclasses.replace(self, nodes=nodes, _graph_cache={})

    def node_of_rank(self, rank: int) -> int:
        return rank // self.gpus_per_node

    # ----- identity ------------------------------------------------------------------------
    def canonical(self) -> dict:
        """The physical content as a plain dict: what the fingerprint hashes (no names of
        the topology itself, no cosmetic labels)."""
        from variopath_jax.topology.spec import to_spec

        spec = to_spec(self)
        spec.pop("name", None)
        spec.pop("assumed", None)
        for dev in spec["devices"]:
            dev.pop("label", None)
        return spec

    @cached_property
    def fingerprint(self) -> str:
        """A stable hash of the canonical form: equal for equal physics, across runs."""
        blob = json.dumps(self.canonical(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    # ----- the expanded graph --------------------------------------------------------------
    @cached_property
    def graph(self) -> Graph:
        return Graph(self)

    # ----- nvidia-smi style relations ------------------------------------------------------
    def relations(self) -> list[list[str]]:
        """GPU×GPU relation classes over all ranks; ``NET`` between nodes."""
        gpus = [d.name for d in self.node.gpus]
        local = [[render_relation(self.node, a, b) for b in gpus] for a in gpus]
        return _tile(local, self.nodes, self.gpus_per_node, self.gpus_per_node)

    def nic_relations(self) -> list[list[str]]:
        """GPU×NIC relation classes over all ranks and NICs; ``NET`` between nodes."""
        gpus = [d.name for d in self.node.gpus]
        nics = [d.name for d in self.node.nics]
        local = [[self.node.relation(a, n) for n in nics] for a in gpus]
        return _tile(local, self.nodes, len(gpus), len(nics))


def render_relation(node: NodeSpec, a: str, b: str) -> str:
    """Relation as ``nvidia-smi topo -m`` prints it: NVLink-bridged GPU pairs show ``NV#``."""
    count = node.nvlinks(a, b) if a != b else 0
    return f"NV{count}" if count else node.relation(a, b)


def _tile(local: list[list[str]], nodes: int, rows: int, cols: int) -> list[list[str]]:
    out = []
    for na in range(nodes):
        for r in range(rows):
            out.append(
                [local[r][c] if na == nb else "NET" for nb in range(nodes) for c in range(cols)]
            )
    return out


@dataclass(frozen=True)
class LinkLayout:
    """How link ids are numbered (the one rule paths, catalogs and the C++ core share).

    Node ``k``'s tree and extra links are ``[k * links_per_node, (k + 1) * links_per_node)``;
    each node's network links (NIC to network or ToR, ToR uplinks) follow all node blocks, one
    block of ``net_links_per_node`` per node. A *local* id is a link's id in the one-node graph of
    the same node: below ``links_per_node`` a tree link, at or above it a network link.
    """

    nodes: int
    links_per_node: int
    net_links_per_node: int

    def global_link(self, local: int, node: int) -> int:
        """The id on node ``node`` of a link given by its local id."""
        if local < self.links_per_node:
            return node * self.links_per_node + local
        return (
            self.nodes * self.links_per_node
            + node * self.net_links_per_node
            + (local - self.links_per_node)
        )

    def local_link(self, lid: int) -> tuple[int, int]:
        """(node, local id) of a link id."""
        tree = self.nodes * self.links_per_node
        if lid < tree:
            return divmod(lid, self.links_per_node)
        node, rest = divmod(lid - tree, self.net_links_per_node)
        return node, self.links_per_node + rest


class Graph:
    """The expanded multi-node graph: vertices ``n{k}/{device}`` plus the network.

    Directed links are numbered node-major by ``self.layout`` (:class:`LinkLayout`). Link ids
    are what footprints, schedules and the simulator refer to.
    """

    def __init__(self, topo: Topology) -> None:
        node = topo.node
        self.topology = topo
        self.vertices: list[str] = []
        self.kinds: list[str] = []
        self.node_of: list[int] = []
        self.parent: list[int] = []
        self.index: dict[str, int] = {}
        self.links: list[DirectedLink] = []
        self._link_id: dict[tuple[int, int], int] = {}

        for k in range(topo.nodes):
            for dev in node.devices:
                self._add_vertex(f"n{k}/{dev.name}", dev.kind, k)
        for k in range(topo.nodes):
            for dev in node.devices:
                if dev.parent is not None:
                    self.parent[self.index[f"n{k}/{dev.name}"]] = self.index[f"n{k}/{dev.parent}"]
        self.links_per_node = 0
        for k in range(topo.nodes):
            start = len(self.links)
            for dev in node.devices:
                if dev.parent is None:
                    continue
                child, parent = self.index[f"n{k}/{dev.name}"], self.index[f"n{k}/{dev.parent}"]
                self._add_link(child, parent, dev.up_gbs, "pcie")
                self._add_link(parent, child, dev.down_gbs, "pcie")
            for lk in node.links:
                a, b = self.index[f"n{k}/{lk.a}"], self.index[f"n{k}/{lk.b}"]
                kind = _kind_of_link(node, lk)
                self._add_link(a, b, lk.ab_gbs, kind)
                self._add_link(b, a, lk.ba_gbs, kind)
            self.links_per_node = len(self.links) - start
        self.net = -1
        self.hub: dict[int, int] = {}  # NIC vertex -> the vertex its network link leads to
        if node.nics:
            self.net = self._add_vertex("net", "net", -1)
            nic_total = sum(d.nic_gbps for d in node.nics) / 8.0
            for k in range(topo.nodes):
                hub = self.net
                if topo.oversubscription > 1.0:
                    hub = self._add_vertex(f"n{k}/tor", "tor", k)
                for dev in node.nics:
                    nic = self.index[f"n{k}/{dev.name}"]
                    self._add_link(nic, hub, dev.nic_gbps / 8.0, "nic")
                    self._add_link(hub, nic, dev.nic_gbps / 8.0, "nic")
                    self.hub[nic] = hub
                if hub != self.net:
                    uplink = nic_total / topo.oversubscription
                    self._add_link(hub, self.net, uplink, "uplink")
                    self._add_link(self.net, hub, uplink, "uplink")
        self.layout = LinkLayout(
            topo.nodes,
            self.links_per_node,
            (len(self.links) - topo.nodes * self.links_per_node) // topo.nodes,
        )
        self.gpus = [self.index[f"n{k}/{d.name}"] for k in range(topo.nodes) for d in node.gpus]
        self.nics = [self.index[f"n{k}/{d.name}"] for k in range(topo.nodes) for d in node.nics]

    def _add_vertex(self, name: str, kind: str, node: int) -> int:
        self.index[name] = len(self.vertices)
        self.vertices.append(name)
        self.kinds.append(kind)
        self.node_of.append(node)
        self.parent.append(-1)
        return self.index[name]

    def _add_link(self, src: int, dst: int, gbs: float, kind: str) -> int:
        if (src, dst) in self._link_id:
            raise TopologyError(
                f"two links join {self.vertices[src]!r} and {self.vertices[dst]!r}; "
                "give parallel links as one link with the summed capacity"
            )
        lid = len(self.links)
        self.links.append(DirectedLink(lid, src, dst, gbs, kind))
        self._link_id[(src, dst)] = lid
        return lid

    def link(self, src: int, dst: int) -> int:
        """Id of the directed link src→dst."""
        return self._link_id[(src, dst)]

    @cached_property
    def symmetric(self) -> bool:
        """Whether every directed link's reverse exists with the same capacity (every preset's
        links; a measured topology's may differ by direction). Only then is a plan reversed
        (``schedule.reversed_schedule``: j → i along i → j's path, its rates and pacing caps
        kept) a plan of the transposed demand as fast and as well paced, which the op's reuse
        of a cached paced plan for the transposed demand needs (ffi/layout.cc ``plan_for``)."""
        for lk in self.links:
            back = self._link_id.get((lk.dst, lk.src))
            if back is None or self.links[back].gbs != lk.gbs:
                return False
        return True

    def link_name(self, lid: int) -> str:
        lk = self.links[lid]
        return f"{self.vertices[lk.src]}->{self.vertices[lk.dst]}"

    def up_chain(self, v: int) -> list[int]:
        """Vertices from ``v`` up to its socket, ``v`` included."""
        chain = [v]
        while self.parent[chain[-1]] >= 0:
            chain.append(self.parent[chain[-1]])
        return chain

    def tree_route(self, a: int, b: int) -> list[int]:
        """Directed links of the unique tree route between two vertices of one node, crossing
        the inter-socket link when their sockets differ."""
        up_a, up_b = self.up_chain(a), self.up_chain(b)
        if up_a[-1] != up_b[-1]:
            socket_link = self._link_id.get((up_a[-1], up_b[-1]))
            if socket_link is None:
                raise TopologyError(
                    f"no inter-socket link between {self.vertices[up_a[-1]]} and "
                    f"{self.vertices[up_b[-1]]}"
                )
            return [*self._walk_up(up_a), socket_link, *self._walk_down(up_b)]
        in_b = {v: i for i, v in enumerate(up_b)}
        cut_a = next(i for i, v in enumerate(up_a) if v in in_b)
        cut_b = in_b[up_a[cut_a]]
        return self._walk_up(up_a[: cut_a + 1]) + self._walk_down(up_b[: cut_b + 1])

    def _walk_up(self, chain: list[int]) -> list[int]:
        """Links along an upward chain of vertices, first to last."""
        return [self.link(x, y) for x, y in pairwise(chain)]

    def _walk_down(self, chain: list[int]) -> list[int]:
        """Links down an upward chain of vertices, from its last vertex to its first."""
        return [self.link(y, x) for x, y in pairwise(chain)][::-1]
