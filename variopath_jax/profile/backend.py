"""What the profiler measures through: a :class:`Backend` runs *experiments* (lists of
:class:`Transfer`) on some machine and reports when each transfer ended. The profiler
(:mod:`variopath_jax.profile.measure`) knows nothing else about the machine: which routes exist
per path class, which routes isolate a link class, and the times; for the posted-write trigger
probe (:mod:`~variopath_jax.profile.trigger`), the topology of its GPUs and a route per flow.

Backends:

- :class:`EmulatedBackend`: an emulated machine in C++ (``ffi/emulated_machine.h``) with injected
  link rates, per-class losses (β, floor, paced_lossless) and per-message costs (o, L, σ, λ) on a
  deterministic virtual clock, and optionally a topology's PCIe fabric with an injected
  posted-write trigger. CI profiles it and checks the fit recovers what was injected.
- :class:`CudaBackend`: copies between the GPUs of this process (``ffi/cuda/profile_cuda.cc``),
  timed with CUDA events. It compiles wherever nvcc exists and has never run on a GPU.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from variopath_jax.errors import VarioPathError
from variopath_jax.sim.network import (
    BARRIER_S,
    DEFAULT_TRIGGER_FACTOR,
    ISSUE_S,
    LATENCY_NET_S,
    LATENCY_PCIE_S,
    LINK_CLASSES,
    SIGNAL_S,
    NetworkModel,
    RootPorts,
)
from variopath_jax.topology.model import Topology


class ProfileError(VarioPathError):
    """A profile cannot be measured, fitted or read; names the input and what is wrong."""


@dataclass(frozen=True)
class Transfer:
    """One copy of an experiment. ``cap_bps`` paces it (bytes per second, 0: unpaced); transfers
    of one ``step`` (non-decreasing) run after every transfer of the previous step ended plus a
    barrier; ``after`` names an earlier transfer of the same step it waits for (a signal), or -1."""

    route: int
    nbytes: int
    cap_bps: float = 0.0
    step: int = 0
    after: int = -1


class Backend(Protocol):
    """A machine the profiler measures."""

    name: str

    def describe(self) -> dict[str, Any]:
        """What was measured (host, devices, or the injected parameters): kept in the output."""

    def path_routes(self) -> dict[str, int]:
        """Per path class (``PIX PXB PHB NODE SYS SHM NET``) one route of that class."""

    def class_routes(self, link_class: str, k: int) -> list[int] | None:
        """k routes whose transfers all cross one link of ``link_class`` (and no link that loses
        more), or None when this backend cannot isolate that class."""

    def latency_route(self, kind: str) -> int | None:
        """A route to measure per-message costs on: ``pcie`` or ``net`` (None: not here)."""

    def run(self, transfers: Sequence[Transfer]) -> np.ndarray:
        """Run one experiment; when each transfer ended, seconds after the experiment began."""

    def trigger_topology(self) -> Topology | None:
        """The topology whose GPUs (indexed in its node's order) the trigger probe's flows join,
        or None: this backend cannot tell root complexes apart."""

    def flow_routes(self, flows: Sequence[Any]) -> list[int]:
        """A route per trigger flow (``trigger.Flow``: src, dst GPU indices and pull)."""


# ----- the emulated machine --------------------------------------------------------------------
@dataclass(frozen=True)
class Injected:
    """What the emulated machine is given (GB/s, seconds): per link class β, floor and
    paced_lossless; the per-message costs; the link rates of its wiring; seeded jitter (each
    experiment scales every link by 1 + U(-jitter, jitter)); the posted-write trigger's factor
    on the fabric of a topology, where one is emulated (1: no trigger)."""

    contention: Mapping[str, Mapping[str, Any]] = field(
        default_factory=lambda: {
            c: {"beta": 0.0, "floor": 0.0, "paced_lossless": True} for c in LINK_CLASSES
        }
    )
    # costs: the `pcie` model's defaults, each with its source in sim/network.py
    issue_s: float = ISSUE_S
    latency_pcie_s: float = LATENCY_PCIE_S
    latency_net_s: float = LATENCY_NET_S
    signal_s: float = SIGNAL_S
    barrier_s: float = BARRIER_S
    # wiring: nominal PCIe Gen5 x16 GPU links (64), Gen4 x16 root ports (32), a 400 Gb/s NIC
    # (50); the socket link (40) and host memory path (24) are assumptions of this emulator
    gpu_gbs: float = 64.0
    root_gbs: float = 32.0
    socket_gbs: float = 40.0
    host_gbs: float = 24.0
    nic_gbs: float = 50.0
    jitter: float = 0.0
    seed: int = 0
    trigger_factor: float = 1.0

    @classmethod
    def from_network(
        cls, model: NetworkModel, topology: Topology | None = None, **changes: Any
    ) -> Injected:
        """The costs, per-class losses and trigger factor of a network model (on ``topology``:
        its measured factor where the model names none), on the default wiring."""
        if topology is not None:
            factor = model.trigger_factor_for(topology)
        elif model.trigger:
            factor = model.trigger_factor or DEFAULT_TRIGGER_FACTOR
        else:
            factor = None
        changes.setdefault("trigger_factor", 1.0 if factor is None else float(factor))
        return cls(
            contention={
                c: {
                    "beta": p["beta"],
                    "floor": p["floor"],
                    "paced_lossless": bool(p.get("paced_lossless", True)),
                }
                for c, p in model.contention.items()
            },
            issue_s=model.issue_s,
            latency_pcie_s=model.latency_pcie_s,
            latency_net_s=model.latency_net_s,
            signal_s=model.signal_s,
            barrier_s=model.barrier_s,
            **changes,
        )

    def replace(self, **changes: Any) -> Injected:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["contention"] = {c: dict(p) for c, p in self.contention.items()}
        return out


# Remote NICs of the emulated machine: enough to fan 16 flows out of (into) one NIC, each remote
# NIC taking (sending) one.
_REMOTE_NICS = 16


class EmulatedBackend:
    """The emulated machine: two sockets; socket 0 has switches 0 and 1 under its root complex,
    socket 1 switch 2; GPU0 and GPU1 share switch 0, GPU2 sits on switch 1, GPU3 on switch 2, NIC0
    on switch 0; 16 remote NICs across a non-blocking network. Routes: PIX GPU0→GPU1, PHB
    GPU0→GPU2 (P2P through the root complex), SYS GPU0→GPU3 (and the socket link), SHM GPU0→GPU2
    staged through host memory, NET GPU0→NIC0→remote NIC.

    With a ``topology``, the machine also has one node of it: its PCIe tree (and socket links)
    as links of their own (a link joining a CPU root port is ``root_p2p``, the others
    ``switch``; the socket link ``root_p2p``), with the root complexes of its root ports
    (``sim.network.RootPorts``) and the injected trigger factor, and a pushed and a pulled route
    between every two of its GPUs, for the trigger probe. The probes of the link classes, paths
    and costs keep the wiring above."""

    name = "emulated"

    def __init__(self, injected: Injected, topology: Topology | None = None) -> None:
        from variopath_jax._native import EmulatedMachine

        classes = list(LINK_CLASSES)
        unknown = set(injected.contention) - set(classes)
        if unknown:
            raise ProfileError(f"injected contention: unknown link classes {sorted(unknown)}")
        self.injected = injected
        capacity: list[float] = []
        link_class: list[int] = []

        def link(gbs: float, cls: str) -> int:
            capacity.append(gbs * 1e9)
            link_class.append(classes.index(cls))
            return len(capacity) - 1

        i = injected
        gpu0_up, gpu1_down = link(i.gpu_gbs, "switch"), link(i.gpu_gbs, "switch")
        sw0_up, sw1_down, gpu2_down = (
            link(i.root_gbs, "root_p2p"),
            link(i.root_gbs, "root_p2p"),
            link(i.gpu_gbs, "switch"),
        )
        socket, sw2_down, gpu3_down = (
            link(i.socket_gbs, "root_p2p"),
            link(i.root_gbs, "root_p2p"),
            link(i.gpu_gbs, "switch"),
        )
        to_host, from_host = link(i.host_gbs, "root_dma"), link(i.host_gbs, "root_dma")
        sw0_nic0, nic0_out, nic0_in = (
            link(i.gpu_gbs, "switch"),
            link(i.nic_gbs, "nic_out"),
            link(i.nic_gbs, "nic_in"),
        )
        remote_in = [link(i.nic_gbs, "nic_in") for _ in range(_REMOTE_NICS)]
        remote_out = [link(i.nic_gbs, "nic_out") for _ in range(_REMOTE_NICS)]
        pcie, net = i.latency_pcie_s, i.latency_net_s
        routes: list[tuple[list[int], int, float]] = [  # (links, source endpoint, L)
            ([gpu0_up, gpu1_down], 0, pcie),  # 0: PIX
            ([gpu0_up, sw0_up, sw1_down, gpu2_down], 0, pcie),  # 1: PHB
            ([gpu0_up, sw0_up, socket, sw2_down, gpu3_down], 0, pcie),  # 2: SYS
            ([gpu0_up, to_host, from_host, gpu2_down], 0, pcie),  # 3: SHM
        ]
        self._out = [len(routes) + j for j in range(_REMOTE_NICS)]  # GPU0 → NIC0 → remote j
        routes += [
            ([gpu0_up, sw0_nic0, nic0_out, remote_in[j]], 0, net) for j in range(_REMOTE_NICS)
        ]
        self._in = [len(routes) + j for j in range(_REMOTE_NICS)]  # remote j → NIC0
        routes += [([remote_out[j], nic0_in], 1 + j, net) for j in range(_REMOTE_NICS)]
        root_complex = [-1] * len(capacity)
        uplink = [False] * len(capacity)
        pull = [False] * len(routes)
        self.topology = None if topology is None else topology.with_nodes(1)
        self._flow_route: dict[tuple[int, int, bool], int] = {}
        if self.topology is not None:
            g, ports = self.topology.graph, RootPorts(self.topology)
            mine: dict[int, int] = {}  # graph link → emulated link
            for lid, lk in enumerate(g.links):
                if lk.kind not in ("pcie", "socket"):
                    continue
                on_port = ports.complex[lid] >= 0
                mine[lid] = link(lk.gbs, "root_p2p" if on_port or lk.kind == "socket" else "switch")
                root_complex.append(int(ports.complex[lid]))
                uplink.append(bool(ports.uplink[lid] >= 0))
            first = 1 + _REMOTE_NICS  # endpoints: GPU0 of the wiring, the remote NICs, then these
            for a, va in enumerate(g.gpus):
                for b, vb in enumerate(g.gpus):
                    if a == b:
                        continue
                    path = [mine[lid] for lid in g.tree_route(va, vb)]
                    for is_pull in (False, True):
                        self._flow_route[(a, b, is_pull)] = len(routes)
                        routes.append((path, first + (b if is_pull else a), pcie))
                        pull.append(is_pull)
        params = [
            {"beta": 0.0, "floor": 0.0, "paced_lossless": True, **injected.contention.get(c, {})}
            for c in classes
        ]
        try:
            self._machine = EmulatedMachine(
                capacity=capacity,
                link_class=link_class,
                beta=[float(p["beta"]) for p in params],
                floor=[float(p["floor"]) for p in params],
                paced_lossless=[bool(p["paced_lossless"]) for p in params],
                routes=[r[0] for r in routes],
                route_source=[r[1] for r in routes],
                route_latency=[r[2] for r in routes],
                issue_s=i.issue_s,
                signal_s=i.signal_s,
                barrier_s=i.barrier_s,
                jitter=i.jitter,
                seed=i.seed,
                root_complex=root_complex,
                uplink=uplink,
                route_pull=pull,
                trigger_factor=i.trigger_factor,
            )
        except (ValueError, TypeError) as err:
            raise ProfileError(f"injected parameters: {err}") from None
        self._experiments = 0

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"backend": self.name, "injected": self.injected.to_dict()}
        if self.topology is not None:
            out["topology"] = self.topology.name
        return out

    def trigger_topology(self) -> Topology | None:
        return self.topology

    def flow_routes(self, flows: Sequence[Any]) -> list[int]:
        try:
            return [self._flow_route[(f.src, f.dst, f.pull)] for f in flows]
        except KeyError as err:
            raise ProfileError(
                f"the emulated machine has no route for trigger flow {err.args[0]} (a topology "
                "with those GPUs?)"
            ) from None

    def path_routes(self) -> dict[str, int]:
        return {"PIX": 0, "PHB": 1, "SYS": 2, "SHM": 3, "NET": self._out[0]}

    def class_routes(self, link_class: str, k: int) -> list[int] | None:
        if not 1 <= k <= _REMOTE_NICS:
            raise ProfileError(f"flow count {k}: the emulated machine isolates 1..{_REMOTE_NICS}")
        per_class = {"switch": 0, "root_p2p": 1, "root_dma": 3}
        if link_class in per_class:
            return [per_class[link_class]] * k
        if link_class == "nic_out":  # one NIC sending to k remote NICs
            return self._out[:k]
        if link_class == "nic_in":  # k remote NICs sending to one
            return self._in[:k]
        return None

    def latency_route(self, kind: str) -> int | None:
        return {"pcie": 0, "net": self._out[0]}.get(kind)

    def run(self, transfers: Sequence[Transfer]) -> np.ndarray:
        self._experiments += 1
        try:
            ends = self._machine.run(
                route=[t.route for t in transfers],
                nbytes=[int(t.nbytes) for t in transfers],
                cap=[float(t.cap_bps) for t in transfers],
                step=[t.step for t in transfers],
                after=[t.after for t in transfers],
                experiment=self._experiments,
            )
        except ValueError as err:
            raise ProfileError(str(err)) from None
        return np.asarray(ends, dtype=np.float64)


# ----- CUDA: copies between the GPUs of this process --------------------------------------------
# Which link class a pair of GPUs of a path class isolates (DESIGN.md "Paths"; sim.network).
_CLASS_OF_PATH = {"PIX": "switch", "PXB": "switch", "PHB": "root_p2p", "NODE": "root_p2p"}


class CudaBackend:
    """Copies between the GPUs of this process (``cudaMemcpyPeerAsync``, staged through pinned
    host memory for ``SHM``), each transfer on a stream of its own, paced in chunks held against
    the GPU clock, timed with CUDA events on the sending device. ``pairs`` names, per path class,
    the (source, destination) devices (``nvidia-smi topo -m`` shows the class of each pair); the
    class routes of ``root_dma`` are copies from ``dma_device`` to pinned host memory. One
    experiment's transfers must all leave one device. NIC classes and ``NET`` are not measured
    here (they need processes on two nodes: cuda-ipc / NCCL, a follow-up).

    With a ``topology`` whose node's GPUs are this process's CUDA devices in order (``sysfs``
    lists them in PCI order: run with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``), it runs the trigger
    probe: a pushed flow is a copy kernel on its source device storing into the destination's
    memory (posted writes), a pulled one a copy kernel on its destination device loading from
    the source's (reads); an experiment's flows are released together and each is timed on the
    device that issues it (``cuda_trigger_run``). Never ran on a GPU."""

    name = "cuda"

    def __init__(
        self,
        pairs: Mapping[str, tuple[int, int]],
        dma_device: int = 0,
        timeout_s: float = 60.0,
        topology: Topology | None = None,
    ) -> None:
        from variopath_jax._native import build_info

        if not build_info()["cuda"]:
            raise ProfileError(
                "backend cuda: this build of variopath_jax has no CUDA parts (no nvcc at build "
                "time); use --backend emulated or rebuild where nvcc exists"
            )
        bad = set(pairs) - set(_CLASS_OF_PATH) - {"SYS", "SHM"}
        if bad:
            raise ProfileError(
                f"backend cuda: path classes {sorted(bad)} cannot be measured in one process; "
                f"name pairs of {', '.join(sorted(set(_CLASS_OF_PATH) | {'SYS', 'SHM'}))}"
            )
        self._routes = [(int(s), int(d), cls == "SHM") for cls, (s, d) in pairs.items()]
        self._route_of = {cls: n for n, cls in enumerate(pairs)}
        self._dma = len(self._routes)
        self._routes.append((int(dma_device), -1, True))  # device → pinned host memory
        self.pairs = dict(pairs)
        self.timeout_s = timeout_s  # per experiment: a transfer not done by then is an error
        self.topology = None if topology is None else topology.with_nodes(1)
        self._flows: list[tuple[int, int, bool]] = []  # trigger routes: (src, dst, pull)

    def describe(self) -> dict[str, Any]:
        from variopath_jax._native import cuda_devices

        out = {
            "backend": self.name,
            "pairs": {c: list(p) for c, p in self.pairs.items()},
            "devices": cuda_devices(),
        }
        if self.topology is not None:
            out["topology"] = self.topology.name
        return out

    def trigger_topology(self) -> Topology | None:
        return self.topology

    def flow_routes(self, flows: Sequence[Any]) -> list[int]:
        out = []
        for f in flows:
            key = (int(f.src), int(f.dst), bool(f.pull))
            if key not in self._flows:
                self._flows.append(key)
            out.append(len(self._routes) + self._flows.index(key))
        return out

    def path_routes(self) -> dict[str, int]:
        return dict(self._route_of)

    def class_routes(self, link_class: str, k: int) -> list[int] | None:
        if link_class == "root_dma":
            return [self._dma] * k
        for cls, route in self._route_of.items():
            if _CLASS_OF_PATH.get(cls) == link_class:
                return [route] * k
        return None

    def latency_route(self, kind: str) -> int | None:
        return next(iter(self._route_of.values()), None) if kind == "pcie" else None

    def run(self, transfers: Sequence[Transfer]) -> np.ndarray:
        from variopath_jax._native import cuda_profile_run

        flows = [t.route - len(self._routes) for t in transfers]
        if any(k >= 0 for k in flows):
            return self._run_flows(transfers, flows)
        out = cuda_profile_run(
            route_src=[r[0] for r in self._routes],
            route_dst=[r[1] for r in self._routes],
            route_staged=[r[2] for r in self._routes],
            route=[t.route for t in transfers],
            nbytes=[int(t.nbytes) for t in transfers],
            cap=[float(t.cap_bps) for t in transfers],
            step=[t.step for t in transfers],
            after=[t.after for t in transfers],
            timeout_s=self.timeout_s,
        )
        if out["error"]:
            raise ProfileError(f"backend cuda: {out['error']}")
        return np.asarray(out["ends"], dtype=np.float64)

    def _run_flows(self, transfers: Sequence[Transfer], flows: list[int]) -> np.ndarray:
        """An experiment of the trigger probe: unpaced flows of one step, released together."""
        from variopath_jax._native import cuda_trigger_run

        if any(k < 0 or k >= len(self._flows) for k in flows):
            raise ProfileError("backend cuda: an experiment mixes trigger flows with other routes")
        if any(t.cap_bps > 0 or t.step != 0 or t.after >= 0 for t in transfers):
            raise ProfileError("backend cuda: trigger flows run unpaced, in one step, at once")
        out = cuda_trigger_run(
            src=[self._flows[k][0] for k in flows],
            dst=[self._flows[k][1] for k in flows],
            pull=[self._flows[k][2] for k in flows],
            nbytes=[int(t.nbytes) for t in transfers],
            timeout_s=self.timeout_s,
        )
        if out["error"]:
            raise ProfileError(f"backend cuda: {out['error']}")
        return np.asarray(out["ends"], dtype=np.float64)
