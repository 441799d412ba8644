"""The network model the simulator judges schedules by (DESIGN.md "Network model";
docs/simulator.md "The network model").

A :class:`NetworkModel` names every parameter of the simulation apart from the topology:

- **Step semantics.** λ (``barrier_s``) is the cost of a global barrier: a barrier step starts λ
  after the steps it depends on. A transfer may instead wait for individual earlier transfers
  (signal-driven execution, ``Transfer.after``): it becomes ready σ (``signal_s``) after the last
  of them ended.
- **Per-message cost, LogGP-style** (Alexandrov et al., SPAA'95). A post costs an issue overhead
  o (``issue_s``) at the endpoint that posts it, the sender; posts of one endpoint are
  serialised. A barrier step's transfers from one sender are posted together, as one grouped
  ``ncclSend`` launch or one doorbell batch; a signal-driven transfer is a post of its own. Data
  moves from the end of the post (``serial_issue = False`` lets an endpoint issue posts in
  parallel, as the simulator before this model did). The latency L (``latency_pcie_s``, or
  ``latency_net_s`` for paths through a NIC) delays a transfer's end, occupies no link and
  overlaps with the next post.
- **Contention** (``contention``, ``trigger``). ``none`` shares every link perfectly (max-min).
  Under ``pcie`` and ``pcie-fair`` an *oversubscribed* link delivers
  ``C · max(floor, 1 / (1 + β (k - 1)))`` for its k distinct flows, with β and floor per link
  class (:data:`LINK_CLASSES`). A link is oversubscribed when its flows' rate caps add up to more
  than its capacity, or when its class does not share paced flows losslessly
  (``paced_lossless`` false, with its ``paced_source``) and k ≥ 2. Through a CPU root complex
  flows share fairly (16 flows on one uplink keep 96%), except for one trigger (``pcie`` only):
  pushed peer-to-peer **writes** leaving one root port's uplink toward two or more distinct root
  complexes at once collapse that uplink to ``trigger_factor · C`` (:class:`RootPorts` says
  which writes count). ``pcie-fair`` is the same model without the trigger, the platforms where
  it was not seen (research/contention-evidence.md "The posted-write collapse").

Every default names the measurement it comes from; docs/simulator.md shows the fit beside the
hold-outs. A JSON file (:func:`load_network`) can give every parameter, so a user who measured
their machine plans and simulates against it.
"""

from __future__ import annotations

import dataclasses
import json
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from variopath_jax.errors import VarioPathError
from variopath_jax.topology import Topology

FORMAT = "variopath-network"
VERSION = 1

# Link classes of the contention model, and what they are (see link_classes):
LINK_CLASSES = {
    "root_p2p": "a link into or out of a CPU root complex, or between sockets, while it carries "
    "peer-to-peer traffic through the root complex",
    "root_dma": "the same links while they carry only traffic to or from host memory (staged)",
    "switch": "PCIe links between switches and devices, switch-to-switch fabric links",
    "nic_out": "a NIC's link into the network (egress)",
    "nic_in": "the network's link into a NIC (ingress, incast)",
}

# ----- defaults, each with its source ----------------------------------------------------------
# λ, a global barrier: "measured at approximately 20 µs on our 32-GPU RTX 5090 testbed" (paper §5).
BARRIER_S = 20e-6
# o, posting one transfer (or one grouped launch). The paper's runtime posts GPU-initiated RDMA
# work requests (NCCL GIN over GDAKI, §5); we charge 1 µs, half of the 2 µs per-transfer α the
# model used before the split (research/topology-formats.md §4.3: PCIe P2P latency 0.4-1.4 µs,
# RDMA a few µs), the other half being part of L.
ISSUE_S = 1e-6
# L over PCIe: P2P write latency 0.71-0.74 µs same NUMA, 1.27-1.36 µs cross NUMA (rtx6kpro,
# ESC8000A; research/topology-formats.md §4.3): 1 µs.
LATENCY_PCIE_S = 1e-6
# L through a NIC: a 1 KiB transfer between two RTX 5090 servers takes 7.872 µs P50 (paper §5),
# which is o + L + 1 KiB at 50 GB/s (0.02 µs): L = 6.85 µs.
LATENCY_NET_S = 7.872e-6 - ISSUE_S - 1024 / 50e9
# σ, observing a signal-driven dependency: a flag written over PCIe and polled, one P2P write
# latency (same source as LATENCY_PCIE_S).
SIGNAL_S = 1e-6

# Per link class: an oversubscribed link with k flows delivers C · η(k),
# η(k) = max(floor, 1 / (1 + β (k - 1))): each flow beyond the first adds the fraction β of
# overhead, and the floor is the loss measured at the largest flow count the class was fitted on,
# so the model never extrapolates a loss beyond what was measured (docs/simulator.md
# "Calibration"; `python benchmarks/calibrate_network.py` prints the fit and the hold-outs).
# - root_p2p: fair sharing through a root complex, voipmonitor/rtx6kpro
#   hardware/wrx90-cpayne-2switch-flat.md: flows sharing one Gen5 x16 uplink, 1 flow 53.8 GB/s,
#   16 flows 51.6 in all: 1 / (1 + 15β) = 51.6 / 53.8 gives β = 0.00284; floor 51.6 / 53.8
#   (2 flows: η = 0.997, measured 52.1 / 52.5 = 0.992 and 53.8 / 53.8).
# - root_dma: NVIDIA/nccl issue 1603, 4 RTX 4090 on one socket's root ports (preset
#   root4-gen4), staged through host memory (P2P off): alltoall busbw 18 GB/s; every GPU link
#   carries 3 flows of 32 GB/s: 32 / (1 + 2β) = 18 gives β = 0.389; floor 18 / 32 (the issue's
#   ring allreduce is staged at 18 GB/s too). It applies to links while they carry staged flows.
# - nic_in: the paper's Figure 10 NCCL point, 18.85 GB/s algbw on 256 R5080-CX8 GPUs (MoE top-8,
#   M = 128; about 500 flows into each NIC), fitted by bisection on β with every other parameter
#   at its default (`calibrate_network.py --fit`); no floor.
# - switch, nic_out: no published measurement isolates them: no loss until measured.
#
# paced_lossless, per class: do flows whose rate caps add up to at most the link's capacity share
# it losslessly (true), or does the link lose by flow count whenever k >= 2 flows share it, paced
# or not (false)? paced_source says where that belief comes from. The defaults take the
# conservative side where no measurement exists (research/contention-evidence.md "Does pacing
# avoid the loss?").
_ROOT_UNPACED = (
    "no published measurement of paced concurrent {} through a root complex: the conservative "
    "side (flows lose by count, paced or not)"
)
_RATE_CONTROL = (
    "rate control against incast and switch congestion is established practice (paced flows "
    "that fit share a link): no loss until measured otherwise"
)
PCIE_CONTENTION = {
    "root_p2p": {
        "beta": (53.8 / 51.6 - 1) / 15,
        "floor": 51.6 / 53.8,
        "paced_lossless": True,
        "paced_source": _RATE_CONTROL + "; the 4% lost by 16 flows was measured with unpaced "
        "flows saturating the uplink (the trigger, which pacing is not assumed to avoid, is "
        "apart: RootPorts)",
    },
    "root_dma": {
        "beta": 0.389,
        "floor": 18 / 32,
        "paced_lossless": False,
        "paced_source": _ROOT_UNPACED.format("DMA to host memory")
        + "; NVIDIA/nccl#1603: fewer, slower NCCL channels did not lift the loss",
    },
    "switch": {"beta": 0.0, "floor": 0.0, "paced_lossless": True, "paced_source": _RATE_CONTROL},
    "nic_out": {"beta": 0.0, "floor": 0.0, "paced_lossless": True, "paced_source": _RATE_CONTROL},
    "nic_in": {
        "beta": 0.004006,
        "floor": 0.0,
        "paced_lossless": True,
        "paced_source": _RATE_CONTROL,
    },
}
NO_CONTENTION = {
    name: {
        "beta": 0.0,
        "floor": 0.0,
        "paced_lossless": True,
        "paced_source": "none: every link shares perfectly",
    }
    for name in LINK_CLASSES
}
_CONTENTION_KEYS = ("beta", "floor", "paced_lossless", "paced_source")

# The posted-write trigger's conservative factor, for a CPU nobody measured: NVIDIA/nccl#1603,
# four RTX 4090 each on its own root port of one socket, P2P all-to-all busbw 2 GB/s: every GPU
# writes to three root complexes at once, the trigger shape, on a Gen4 x16 link of 32 GB/s:
# 2 / 32. The lowest published factor (the Threadripper PRO's is 0.25, presets.trpro_4sw);
# whether pacing avoids the trigger is unmeasured, so paced writes trigger it too.
DEFAULT_TRIGGER_FACTOR = 2 / 32


class NetworkModelError(VarioPathError):
    """A network model is malformed."""


def _real(value: Any) -> bool:
    """A real number (numpy's too), not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool | np.bool_)


@dataclass(frozen=True)
class NetworkModel:
    """Every parameter of the simulation apart from the topology (seconds; β dimensionless).
    Immutable: derive variants with :meth:`replace`. ``contention`` given here is the whole
    table: a class it omits loses nothing (a JSON file, by contrast, overlays the ``pcie``
    defaults, :meth:`from_dict`). A class that omits ``paced_lossless`` (and
    ``paced_source``) takes the ``pcie`` default of its class, the conservative rule.
    ``trigger`` turns the posted-write trigger on; ``trigger_factor`` is the fraction of its
    capacity a triggered uplink keeps: a number (a profile's measurement) or None, the
    topology's measured factor where it has one, else :data:`DEFAULT_TRIGGER_FACTOR`
    (:meth:`trigger_factor_for`)."""

    name: str = "pcie"
    barrier_s: float = BARRIER_S
    issue_s: float = ISSUE_S
    latency_pcie_s: float = LATENCY_PCIE_S
    latency_net_s: float = LATENCY_NET_S
    signal_s: float = SIGNAL_S
    serial_issue: bool = True
    contention: Mapping[str, Mapping[str, float]] = field(
        default_factory=lambda: dict(PCIE_CONTENTION)
    )
    trigger: bool = True
    trigger_factor: float | None = None

    def __post_init__(self) -> None:
        for key in ("barrier_s", "issue_s", "latency_pcie_s", "latency_net_s", "signal_s"):
            value = getattr(self, key)
            if not (_real(value) and value >= 0 and np.isfinite(value)):
                raise NetworkModelError(
                    f"network model {self.name!r}: {key} must be >= 0, got {value!r}"
                )
        for key in ("serial_issue", "trigger"):
            if not isinstance(getattr(self, key), bool):
                raise NetworkModelError(
                    f"network model {self.name!r}: {key} must be true or false, "
                    f"got {getattr(self, key)!r}"
                )
        factor = self.trigger_factor
        if factor is not None and not (_real(factor) and 0 < factor <= 1):
            raise NetworkModelError(
                f"network model {self.name!r}: trigger_factor must be in (0, 1] or null, "
                f"got {factor!r}"
            )
        unknown = set(self.contention) - set(LINK_CLASSES)
        if unknown:
            raise NetworkModelError(
                f"network model {self.name!r}: unknown link classes {sorted(unknown)}; "
                f"known: {', '.join(LINK_CLASSES)}"
            )
        full = {}
        for cls in LINK_CLASSES:
            params = self.contention.get(cls, {"beta": 0.0, "floor": 0.0})
            if not isinstance(params, Mapping) or set(params) - set(_CONTENTION_KEYS):
                raise NetworkModelError(
                    f"network model {self.name!r}: contention.{cls} must be an object with "
                    f"keys among {', '.join(_CONTENTION_KEYS)}, got {params!r}"
                )
            beta, floor = params.get("beta", 0.0), params.get("floor", 0.0)
            default = PCIE_CONTENTION[cls]
            lossless = params.get("paced_lossless", default["paced_lossless"])
            source = params.get(
                "paced_source",
                default["paced_source"] if "paced_lossless" not in params else "not given",
            )
            if not (_real(beta) and beta >= 0 and np.isfinite(beta)):
                raise NetworkModelError(
                    f"network model {self.name!r}: contention.{cls}.beta must be >= 0, got {beta!r}"
                )
            if not (_real(floor) and 0 <= floor <= 1):
                raise NetworkModelError(
                    f"network model {self.name!r}: contention.{cls}.floor must be in [0, 1], "
                    f"got {floor!r}"
                )
            if not isinstance(lossless, bool | np.bool_):
                raise NetworkModelError(
                    f"network model {self.name!r}: contention.{cls}.paced_lossless must be true "
                    f"or false, got {lossless!r}"
                )
            if not isinstance(source, str) or not source.strip():
                raise NetworkModelError(
                    f"network model {self.name!r}: contention.{cls}.paced_source must be a "
                    f"non-empty string naming where the rule comes from, got {source!r}"
                )
            full[cls] = MappingProxyType(
                {
                    "beta": float(beta),
                    "floor": float(floor),
                    "paced_lossless": bool(lossless),
                    "paced_source": source,
                }
            )
        object.__setattr__(self, "contention", MappingProxyType(full))  # read-only

    def efficiency(self, cls: str, flows: np.ndarray) -> np.ndarray:
        """η(k): the fraction of its capacity an oversubscribed link of class ``cls`` delivers
        to ``flows`` distinct flows."""
        p = self.contention[cls]
        k = np.maximum(np.asarray(flows, dtype=np.float64), 1.0)
        return np.maximum(p["floor"], 1.0 / (1.0 + p["beta"] * (k - 1.0)))

    def step_cost(self, topo: Topology) -> float:
        """What a contention-free activation costs beyond λ and its slowest lane's data time,
        for planners and the MILP that model activations as λ + α + max x / bw: o plus the
        latency of its slowest kind of lane (network when the topology has several nodes)."""
        latency = self.latency_net_s if topo.nodes > 1 else self.latency_pcie_s
        return self.issue_s + latency

    def paced_lossless(self, cls: str) -> bool:
        """Whether flows of class ``cls`` whose rate caps fit a link share it losslessly."""
        return bool(self.contention[cls]["paced_lossless"])

    @property
    def contended(self) -> bool:
        """Whether any link class loses throughput when oversubscribed, or the trigger is on."""
        return self.trigger or any(p["beta"] > 0 for p in self.contention.values())

    def trigger_factor_for(self, topo: Topology) -> float | None:
        """The fraction of its capacity a triggered uplink keeps on ``topo``, or None when this
        model has no trigger: the model's own factor (a profile's), else the topology's measured
        one, else :data:`DEFAULT_TRIGGER_FACTOR`."""
        if not self.trigger:
            return None
        if self.trigger_factor is not None:
            return float(self.trigger_factor)
        if topo.trigger_factor is not None:
            return float(topo.trigger_factor)
        return DEFAULT_TRIGGER_FACTOR

    def replace(self, **changes: Any) -> NetworkModel:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": VERSION,
            "name": self.name,
            "barrier_s": self.barrier_s,
            "issue_s": self.issue_s,
            "latency_pcie_s": self.latency_pcie_s,
            "latency_net_s": self.latency_net_s,
            "signal_s": self.signal_s,
            "serial_issue": self.serial_issue,
            "contention": {cls: dict(p) for cls, p in self.contention.items()},
            "trigger": self.trigger,
            "trigger_factor": self.trigger_factor,
        }

    @classmethod
    def from_dict(cls, data: Any, source: str = "network model") -> NetworkModel:
        """A model from a JSON document; omitted parameters keep the ``pcie`` defaults (the
        trigger on, root classes losing by flow count paced or not): the conservative side."""
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise NetworkModelError(
                f'{source}: not a {FORMAT} document (need "format": "{FORMAT}")'
            )
        if data.get("version", VERSION) != VERSION:
            raise NetworkModelError(f"{source}: unsupported version {data.get('version')!r}")
        # "profile": what `variopath profile` measured and fitted (variopath_jax.profile), kept
        # beside the model it wrote; the model does not read it.
        extra = ("format", "version", "profile")
        unknown = set(data) - {f.name for f in dataclasses.fields(cls)} - set(extra)
        if unknown:
            raise NetworkModelError(f"{source}: unknown keys {sorted(unknown)}")
        kwargs = {k: v for k, v in data.items() if k not in extra}
        kwargs.setdefault("name", source)
        contention = {cls: dict(p) for cls, p in PCIE_CONTENTION.items()}
        raw = kwargs.pop("contention", {})
        if not isinstance(raw, dict):
            raise NetworkModelError(
                f"{source}: contention must be an object of link class: "
                "{beta, floor, paced_lossless, paced_source}"
            )
        for link_class, params in raw.items():
            if link_class in contention and isinstance(params, dict):
                if "paced_lossless" in params and "paced_source" not in params:
                    contention[link_class]["paced_source"] = f"{source} (no source given)"
                contention[link_class].update(params)
            else:
                contention[link_class] = params
        try:
            return cls(contention=contention, **kwargs)
        except NetworkModelError as err:
            raise NetworkModelError(f"{source}: {err}") from None

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")


PCIE = NetworkModel()
PCIE_FAIR = NetworkModel(name="pcie-fair", trigger=False)
NONE = NetworkModel(name="none", contention=dict(NO_CONTENTION), trigger=False)
NETWORK_MODELS = {"pcie": PCIE, "pcie-fair": PCIE_FAIR, "none": NONE}


def legacy_model(alpha_s: float, barrier_s: float = 5e-6) -> NetworkModel:
    """The model before the LogGP split: fair sharing, all of the old per-transfer α as issue
    overhead paid in parallel, no latency. It reproduces the earlier simulator's results
    exactly."""
    return NONE.replace(
        name="legacy",
        issue_s=alpha_s,
        latency_pcie_s=0.0,
        latency_net_s=0.0,
        barrier_s=barrier_s,
        serial_issue=False,
    )


# What a planner plans over when the machine has not been measured: the posted-write trigger
# fires on some CPUs and not on others (research/contention-evidence.md), so the robust choice
# weighs the model with it and the one without. `none` (ideal sharing) is a reference, not a
# machine: reported, never hedged against.
UNPROFILED_MODELS = ("pcie", "pcie-fair")

NetworkSpec = str | Path | NetworkModel


def model_names(networks: Sequence[NetworkModel]) -> list[str]:
    """The models' names, made distinct by their position where two share one."""
    names = [net.name for net in networks]
    return [n if names.count(n) == 1 else f"{n}#{k}" for k, n in enumerate(names)]


def load_networks(spec: NetworkSpec | Sequence[NetworkSpec] | None) -> tuple[NetworkModel, ...]:
    """One or several network models: None (:data:`UNPROFILED_MODELS`), a name, a JSON file, a
    comma-separated list of names and files, a :class:`NetworkModel`, or a sequence of these."""
    if spec is None:
        spec = UNPROFILED_MODELS
    if isinstance(spec, NetworkModel | Path):
        return (load_network(spec),)
    if isinstance(spec, str):
        if spec in NETWORK_MODELS or Path(spec).is_file():
            return (load_network(spec),)
        spec = [part.strip() for part in spec.split(",")]
        if not all(spec):
            raise NetworkModelError(f"empty name in the list of network models {spec!r}")
    if not isinstance(spec, Sequence) or not spec:
        raise NetworkModelError(f"a list of network models must name at least one, got {spec!r}")
    return tuple(load_network(part) for part in spec)


def load_network(spec: str | Path | NetworkModel) -> NetworkModel:
    """``pcie``, ``pcie-fair``, ``none``, a :class:`NetworkModel`, or the path of a JSON file
    (see docs)."""
    if isinstance(spec, NetworkModel):
        return spec
    if not isinstance(spec, str | Path):
        raise NetworkModelError(
            f"a network model is {', '.join(NETWORK_MODELS)}, a JSON file or a NetworkModel, "
            f"not {spec!r}"
        )
    if spec in NETWORK_MODELS:
        return NETWORK_MODELS[spec]
    path = Path(spec)
    if not path.is_file():
        raise NetworkModelError(
            f"unknown network model {str(spec)!r}: expected {', '.join(NETWORK_MODELS)} or a "
            "JSON file that exists"
        )
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise NetworkModelError(f"{path}: invalid JSON at line {err.lineno}: {err.msg}") from None
    return NetworkModel.from_dict(data, str(path))


# ----- what the simulator needs per link and per transfer ---------------------------------------
def link_classes(topo: Topology) -> np.ndarray:
    """Per directed link, the index in :data:`LINK_CLASSES` of its class (``root_p2p`` standing for
    both root classes: the simulator picks ``root_dma`` while a link carries only staged flows),
    or -1 for links that never lose throughput (NVLink, node uplinks)."""
    g = topo.graph
    names = list(LINK_CLASSES)
    root = ("cpu", "hostbridge")
    out = np.full(len(g.links), -1, dtype=np.int64)
    for lid, lk in enumerate(g.links):
        if lk.kind == "socket" or (
            lk.kind == "pcie" and (g.kinds[lk.src] in root or g.kinds[lk.dst] in root)
        ):
            out[lid] = names.index("root_p2p")
        elif lk.kind in ("pcie", "fabric"):
            out[lid] = names.index("switch")
        elif lk.kind == "nic":
            out[lid] = names.index("nic_out" if g.kinds[lk.src] == "nic" else "nic_in")
    return out


def through_nic(topo: Topology) -> np.ndarray:
    """Per directed link: does it join a NIC and the network (a transfer crossing one pays the
    network latency)."""
    return np.array([lk.kind in ("nic", "uplink") for lk in topo.graph.links], dtype=bool)


class RootPorts:
    """Where the posted-write trigger is watched and where pushed writes land
    (DESIGN.md "Network model"; research/contention-evidence.md "The posted-write collapse").

    The trigger watches every *uplink* into a CPU root port (a switch's uplink, or the link of a
    device directly on a port). A transfer's bytes on an uplink count as a pushed write toward
    one root complex of the uplink's node (its local index in ``NodeSpec.root_complexes``):

    - staged bytes (host bounce, a NIC leg without GPUDirect RDMA) are DMA writes into host
      memory behind the writer's own root complex;
    - bytes on their way to a NIC are read by it (GPUDirect RDMA): they never count;
    - a peer-to-peer pull within a node (``Transfer.pull``) never counts;
    - anything else is a push toward the root complex of the next root port it goes down
      through (a receiving NIC writes into its GPU's), or, going down none, the uplink's own.
    """

    def __init__(self, topo: Topology) -> None:
        g, node = topo.graph, topo.node
        root = ("cpu", "hostbridge")
        index = {rc: k for k, rc in enumerate(node.root_complexes)}
        self.complexes = len(index)
        n = len(g.links)
        self.uplink = np.full(n, -1, dtype=np.int64)  # index among the uplinks, or -1
        self.complex = np.full(n, -1, dtype=np.int64)  # root complex of the port, up or down
        self.down = np.zeros(n, dtype=bool)
        self.net = np.array([lk.kind in ("nic", "uplink") for lk in g.links], dtype=bool)
        uplinks = 0
        for lid, lk in enumerate(g.links):
            if lk.kind != "pcie" or (g.kinds[lk.src] in root) == (g.kinds[lk.dst] in root):
                continue
            going_up = g.kinds[lk.dst] in root
            device = g.vertices[lk.src if going_up else lk.dst].split("/", 1)[1]
            self.complex[lid] = index[node.root_complex_of(device)]
            if going_up:
                self.uplink[lid] = uplinks
                uplinks += 1
            else:
                self.down[lid] = True
        self.uplinks = uplinks
        self.uplink_links = np.flatnonzero(self.uplink >= 0)  # link id of every uplink, in order

    def phase(self, uplink: int, target: int) -> int:
        """(b - a) mod R: the rotation phase of a write on ``uplink`` (root complex a) toward
        root complex b = ``target``; 0 where it writes into the uplink's own root complex."""
        return (target - int(self.complex[self.uplink_links[uplink]])) % self.complexes

    def writes(self, path: Sequence[int], staged: bool, pull: bool) -> list[tuple[int, int]]:
        """(uplink index, target root complex) for every uplink on which a transfer along
        ``path`` pushes writes."""
        out = []
        to_nic = next((i for i, lid in enumerate(path) if self.net[lid]), -1)
        for i, lid in enumerate(path):
            up = int(self.uplink[lid])
            if up < 0:
                continue
            if staged:
                out.append((up, int(self.complex[lid])))
            elif i < to_nic or (pull and to_nic < 0):
                continue
            else:
                target = next((m for m in path[i + 1 :] if self.down[m]), lid)
                out.append((up, int(self.complex[target])))
        return out
