"""Event-driven fluid network simulator (DESIGN.md "Network model"; docs/simulator.md).

Transfers active at the same time share every directed link they cross by max-min fairness,
computed by progressive filling whenever a transfer starts or ends; each transfer is also capped
by its rate (path rate or pacing rate). The rest of the model, the per-message costs, barriers,
signals and contention, is a :class:`~variopath_jax.sim.network.NetworkModel`:

- a barrier step starts when the steps it depends on have finished plus λ; a transfer with
  ``after`` references also waits until each of them ended plus σ;
- a sender posts a barrier step's transfers to it as one group, and every signal-driven transfer
  on its own; posts of one sender are serialised and each costs o; data moves from the post's end
  and the transfer ends its latency L after the last byte left (L occupies no link);
- under contention, an oversubscribed link delivers C · max(floor, 1 / (1 + β (k - 1))) for its
  k flows; a link is oversubscribed when its flows' rate caps add up to more than C, or when its
  class does not share paced flows losslessly and k ≥ 2 (:func:`delivered_capacity`); with the
  posted-write trigger on, an uplink into a root port whose pushed writes target two or more
  root complexes delivers C · trigger_factor (:class:`~variopath_jax.sim.network.RootPorts`).

Contention-free schedules (one flow per link at a time, at its path rate) therefore run at their
path rates, and a sequence of channel activations finishes at exactly
Σ_k (λ + o + max_i x_ki / bw + L) (paper Eq. 2 plus o and L per step) under every contention
model.

Three things make it fast without changing the result:

- progressive filling works per link: each round finds the link with the lowest fair share,
  freezes only the flows crossing it and updates the counts of the links those flows cross;
- after flows finish, filling resumes at the lowest rate among them: progressive filling freezes
  flows in increasing order of rate, and the rounds below that level saturated only links the
  departed flows do not cross, so they unfold the same without them and every slower flow keeps
  its rate. Contention keeps this exact: a departure never lowers the capacity of a link the
  departed flows cross (fewer flows, never more loss; :func:`delivered_capacity`);
- every flow keeps its projected finish time, so an event touches only the flows whose rates
  changed.

``coalesce`` (on by default) adds one approximation with a stated bound: flows due to finish
close together retire in one event (see :class:`FluidSimulator`).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

import numpy as np

from variopath_jax.schedule import Schedule, ScheduleError
from variopath_jax.sim.network import (
    BARRIER_S,
    LINK_CLASSES,
    PCIE,
    NetworkModel,
    RootPorts,
    link_classes,
    load_network,
    through_nic,
)
from variopath_jax.topology import Topology

# The barrier cost every scheduler plans with by default: the network model's λ.
DEFAULT_LAMBDA_S = BARRIER_S
# ε, the relative tolerance of coalescing (FluidSimulator): 0.1 %. It moved 64-GPU MoE completion
# times by 3e-5 (none) and 3.4e-4 (pcie) (benchmarks/bench_simulator.py) while cutting the
# 256-GPU all-concurrent case under none from 38,176 events (about 3 min) to 1,272 (about 6 s),
# docs/simulator.md; the model's own inputs (λ, o, L, path rates) are
# estimates far coarser than that, and fluid sharing ignores packet-level effects.
DEFAULT_COALESCE = 1e-3

_REL = 1e-9  # relative tolerance for "finished" and "saturated"


@dataclass
class SimResult:
    """What a simulation measured.

    Attributes
    ----------
    completion_s : float
        Time the last transfer finished (0 for an empty schedule).
    step_start, step_end : np.ndarray
        Per step: when it started (after its overhead) and when its last transfer ended.
    transfer_end : np.ndarray
        Finish time of every transfer, in schedule order.
    total_bytes : int
        Demand served (bytes leaving their original source; relayed bytes count once).
    ranks : int
    throughput : list of (t0, t1, GB/s)
        Aggregate data rate over every interval between two events (constant rates when
        coalescing is off; with coalescing, an interval's average).
    link_load : tuple of (intervals, loads) or None
        With ``record_links``: the (E, 2) start/end times of every interval with traffic and the
        (E, L) load of every link during it (average), in GB/s.
    events : int
        Number of times the fair rates were computed.
    network : str
        The name of the network model that judged it.
    """

    completion_s: float
    step_start: np.ndarray
    step_end: np.ndarray
    transfer_end: np.ndarray
    total_bytes: int
    ranks: int
    throughput: list[tuple[float, float, float]] = field(default_factory=list)
    link_load: tuple[np.ndarray, np.ndarray] | None = None
    events: int = 0
    network: str = ""

    @property
    def algbw_gbps(self) -> float:
        """The paper's metric: total payload / (N × completion time), in GB/s."""
        if self.completion_s <= 0:
            return 0.0
        return self.total_bytes / (self.ranks * self.completion_s) / 1e9


def _gather(ptr: np.ndarray, values: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Concatenate ``values[ptr[r]:ptr[r + 1]]`` for every r in ``rows`` (a CSR row gather)."""
    starts = ptr[rows]
    lens = ptr[rows + 1] - starts
    offsets = np.cumsum(lens) - lens
    return values[np.repeat(starts - offsets, lens) + np.arange(int(lens.sum()))]


def _stable_order(links: np.ndarray, n_links: int) -> np.ndarray:
    """Stable argsort of link ids up to ``n_links`` (a radix sort when they fit in 16 bits)."""
    return np.argsort(links.astype(np.uint16) if n_links < 2**16 - 1 else links, kind="stable")


class _Incidence:
    """Which links every flow crosses, indexed both ways, for progressive filling.

    Parameters
    ----------
    n_flows : int
    entry_flow, entry_link : np.ndarray
        One entry per (flow, link) crossing.
    link_cap : np.ndarray
        Capacity of every link (any unit, consistent with ``flow_cap``).
    flow_cap : np.ndarray
        Own cap of every flow.
    """

    def __init__(
        self,
        n_flows: int,
        entry_flow: np.ndarray,
        entry_link: np.ndarray,
        link_cap: np.ndarray,
        flow_cap: np.ndarray,
    ) -> None:
        n_links = len(link_cap)
        self.n_links = n_links
        self.flow_cap = np.asarray(flow_cap, dtype=np.float64)
        # padded (flow, slot) -> link table; the padding names a dummy link n_links of infinite
        # capacity that never saturates
        per_flow = np.bincount(entry_flow, minlength=n_flows)
        order = np.argsort(entry_flow, kind="stable")
        width = int(per_flow.max()) if n_flows and len(entry_flow) else 1
        self.paths = np.full((n_flows, width), n_links, dtype=np.int64)
        flow_first = np.cumsum(per_flow) - per_flow
        sorted_flow = entry_flow[order]
        self.paths[sorted_flow, np.arange(len(order)) - flow_first[sorted_flow]] = entry_link[order]
        # link -> flows (CSR)
        by_link = _stable_order(entry_link, n_links)
        self.link_flows = entry_flow[by_link]
        self.link_ptr = np.concatenate(
            [[0], np.cumsum(np.bincount(entry_link, minlength=n_links))]
        ).astype(np.int64)
        self.cap = np.append(np.asarray(link_cap, dtype=np.float64), np.inf)
        self.cap_order = np.argsort(self.flow_cap, kind="stable")
        # no path crosses a link twice: a link's flow list then has no duplicates
        ordered = np.sort(self.paths, axis=1)
        repeats = (np.diff(ordered, axis=1) == 0) & (ordered[:, 1:] < n_links)
        self.simple = not repeats.any()
        # scratch, one slot per flow: unfrozen during a filling (all False between fillings),
        # and positions for removing duplicates
        self.unfrozen = np.zeros(n_flows, dtype=bool)
        self.stamp = np.zeros(n_flows, dtype=np.int64)

    def link_sums(self, flows: np.ndarray, weights: np.ndarray) -> np.ndarray:
        """Per link (plus the dummy), the sum of ``weights`` over ``flows`` crossing it."""
        return np.bincount(
            self.paths[flows].ravel(),
            weights=np.repeat(weights, self.paths.shape[1]),
            minlength=self.n_links + 1,
        )

    def fill(self, free: np.ndarray, residual: np.ndarray, rate: np.ndarray) -> None:
        """Progressive filling of the ``free`` flows into the ``residual`` link capacities.

        Writes the max-min fair rates of ``free`` into ``rate``; the capacity other flows hold is
        already subtracted from ``residual`` (length ``n_links + 1``, modified in place). Every
        round raises the common level of the unfrozen flows to the next link saturation or flow
        cap and freezes the flows that meet it.
        """
        n_links = self.n_links
        crossing = self.paths[free].ravel()
        count = np.bincount(crossing, minlength=n_links + 1)
        if 4 * len(free) < len(rate):  # few flows: list the flows of each link among them only
            link_ptr = np.concatenate([[0], np.cumsum(count)])
            link_flows = np.repeat(free, self.paths.shape[1])[_stable_order(crossing, n_links)]
            by_cap = free[np.argsort(self.flow_cap[free], kind="stable")]
        else:
            link_ptr, link_flows = self.link_ptr, self.link_flows
            by_cap = None
        count = count.astype(np.float64)
        count[n_links] = 1e300  # the padding link: share inf, never saturated, never empty
        residual[count == 0] = np.inf  # links no unfrozen flow crosses never saturate
        unfrozen = self.unfrozen
        unfrozen[free] = True
        if by_cap is None:
            by_cap = self.cap_order[unfrozen[self.cap_order]]
        caps = np.append(self.flow_cap[by_cap], np.inf)
        next_cap = 0  # index into by_cap of the lowest cap not yet reached
        tol = _REL * self.cap
        tol[n_links] = 0.0
        share = np.empty(n_links + 1)
        left = len(free)
        level = 0.0
        slack = np.empty(n_links + 1)
        tight = np.empty(n_links + 1, dtype=bool)
        empty = np.empty(n_links + 1, dtype=bool)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            while left:
                np.divide(residual, count, out=share)
                link = int(share.argmin())
                lowest = float(share[link])
                cap = float(caps[next_cap])
                level = max(level, min(lowest, cap))
                if level == np.inf:  # nothing limits the remaining flows
                    rate[free[unfrozen[free]]] = np.inf
                    unfrozen[free] = False
                    return
                unique = self.simple
                if lowest <= cap:
                    np.multiply(count, level, out=slack)
                    np.subtract(residual, slack, out=slack)
                    np.less_equal(slack, tol, out=tight)
                    saturated = tight.nonzero()[0]
                    if len(saturated) <= 1:  # rounding: the argmin link saturates regardless
                        frozen = link_flows[link_ptr[link] : link_ptr[link + 1]]
                    else:
                        frozen = _gather(link_ptr, link_flows, saturated)
                        unique = False
                if level * (1 + _REL) >= cap:
                    reached = int(np.searchsorted(caps, level * (1 + _REL), side="right"))
                    capped = by_cap[next_cap:reached]
                    next_cap = reached
                    frozen = np.concatenate([frozen, capped]) if lowest <= cap else capped
                    unique = unique and lowest > cap
                frozen = frozen[unfrozen[frozen]]
                if not unique:
                    positions = np.arange(len(frozen))
                    self.stamp[frozen] = positions
                    frozen = frozen[self.stamp[frozen] == positions]
                rate[frozen] = level
                unfrozen[frozen] = False
                left -= len(frozen)
                crossed = np.bincount(self.paths[frozen].reshape(-1), minlength=n_links + 1)
                count -= crossed
                np.multiply(crossed, level, out=slack)
                residual -= slack
                np.equal(count, 0, out=empty)
                residual[empty] = np.inf


def delivered_capacity(
    network: NetworkModel,
    class_links: dict[str, np.ndarray],
    cap: np.ndarray,
    flows: np.ndarray,
    cap_sum: np.ndarray,
    p2p: np.ndarray,
    triggered: np.ndarray | None = None,
    trigger_factor: float = 1.0,
) -> np.ndarray:
    """Per link, the capacity the contention model lets it deliver to the flows on it.

    ``class_links`` names the links of every class (``root_p2p`` for every root-complex link);
    ``cap`` is each link's capacity, ``flows`` the number of flows on it, ``cap_sum`` their
    summed rate caps and ``p2p`` how many of them are peer-to-peer (the rest are staged). A link
    is oversubscribed when ``cap_sum`` exceeds ``cap``, or when a rule that applies to it is not
    paced-lossless and it carries two or more flows; it then delivers ``cap · η(k)``, else
    ``cap``. A root link carrying P2P takes ``root_p2p``'s η and rule and, if it also carries
    staged flows, ``root_dma``'s too (the lower η, the stricter rule); one carrying only staged
    flows takes ``root_dma``'s. A ``triggered`` link (an uplink whose pushed writes target two
    or more root complexes) delivers at most ``cap · trigger_factor``, paced or not. Removing a
    flow therefore never lowers a link's capacity: η rises as k falls, ``cap_sum`` falls, a rule
    only drops out when its last flow leaves, and fewer flows target fewer root complexes.
    """
    eta = np.ones(len(cap))
    strict = np.zeros(len(cap), dtype=bool)  # a rule applies that charges paced flows
    k = np.rint(flows)
    for name, links in class_links.items():
        if len(links) and name != "root_p2p":
            eta[links] = network.efficiency(name, k[links])
            strict[links] = not network.paced_lossless(name)
    root = class_links.get("root_p2p", np.zeros(0, dtype=np.int64))
    if len(root):
        k_root, p2p_root = k[root], np.rint(p2p[root])
        carries_p2p, carries_staged = p2p_root > 0, k_root - p2p_root > 0
        eta[root] = np.minimum(
            np.where(carries_staged, network.efficiency("root_dma", k_root), 1.0),
            np.where(carries_p2p, network.efficiency("root_p2p", k_root), 1.0),
        )
        strict[root] = (carries_p2p & (not network.paced_lossless("root_p2p"))) | (
            carries_staged & (not network.paced_lossless("root_dma"))
        )
    over = (cap_sum > cap * (1 + _REL)) | (strict & (k >= 2))
    out = np.where(over, cap * eta, cap)
    if triggered is not None:
        out = np.where(triggered, np.minimum(out, cap * trigger_factor), out)
    return out


def max_min_rates(
    active: np.ndarray,
    flow_cap: np.ndarray,
    entry_flow: np.ndarray,
    entry_link: np.ndarray,
    link_cap: np.ndarray,
) -> np.ndarray:
    """Max-min fair rates (bytes/s) of the ``active`` flows by progressive filling.

    All unfrozen flows rise together; a flow freezes when it reaches its own cap or when a link it
    crosses saturates. Inactive flows get rate 0.
    """
    net = _Incidence(len(flow_cap), entry_flow, entry_link, link_cap, flow_cap)
    rate = np.zeros(len(flow_cap))
    net.fill(np.flatnonzero(active), net.cap.copy(), rate)
    return rate


class FluidSimulator:
    """Simulates schedules on one topology.

    Parameters
    ----------
    topo : Topology
    network : NetworkModel or str
        The network model (``"pcie"``, the default; ``"pcie-fair"``; ``"none"``; a JSON file;
        or a model).
    record_links : bool
        Keep per-link loads over time (memory grows with events × links).
    coalesce : float
        Relative tolerance ε ≥ 0 for retiring transfers together; 0 simulates exactly.
        When the next transfer is due to finish, the transfers due soon after it retire in the
        same event, each at its own projected end e under the rates in force, and the rates are
        recomputed once, at the rate-weighted mean t* of those ends. A batch admits a transfer
        only while |t* - e| ≤ ε (e - s) holds for every member (s: when it began moving): the
        bandwidth a transfer frees reaches the others at most ε × its time in flight too early
        or too late. That is the only approximation, and the weighted mean makes the capacity
        left idle before t* and the capacity released early after it cancel to first order. A
        batch never reaches past the next event (a step start, a post, a signal) nor past a
        transfer that others wait for, so contention-free schedules, whose rates never change,
        stay exact. Max-min sharing is not monotone, so the per-event bound does not compose
        into a proven end-to-end one; measured on 64-GPU all-concurrent MoE AlltoAllv with
        ε = 10⁻³ (benchmarks/bench_simulator.py), completion moved by 2.9·10⁻⁵ under `none` and
        3.4·10⁻⁴ under `pcie`, every transfer's end by under ε, with 5.8× and 1.9× fewer events
        (the tests check completion within ε and ends within 2ε under both). With coalescing,
        ``throughput`` and ``link_load`` are averages over each interval, and the bytes
        transfers retired at t* would still move after it go uncounted there.
    """

    def __init__(
        self,
        topo: Topology,
        network: NetworkModel | str = PCIE,
        record_links: bool = False,
        coalesce: float = DEFAULT_COALESCE,
    ) -> None:
        if not coalesce >= 0:
            raise ScheduleError(f"coalesce must be >= 0, got {coalesce}")
        self.topology = topo
        self.network = load_network(network)
        self.record_links = record_links
        self.coalesce = coalesce
        self.link_cap = np.array([lk.gbs * 1e9 for lk in topo.graph.links])
        self.link_class = link_classes(topo)
        self.through_nic = through_nic(topo)
        self.root_ports = RootPorts(topo)

    def run(self, schedule: Schedule) -> SimResult:
        """Simulate ``schedule``; raises :class:`ScheduleError` if it cannot run here."""
        if schedule.fingerprint != self.topology.fingerprint:
            raise ScheduleError(
                f"schedule is for topology {schedule.fingerprint}, "
                f"simulator for {self.topology.fingerprint}"
            )
        return _Run(self, schedule).result()


class _Run:
    """The state of one simulation; :meth:`result` runs it."""

    def __init__(self, sim: FluidSimulator, schedule: Schedule) -> None:
        self.sim = sim
        self.schedule = schedule
        steps = schedule.steps
        n_steps = len(steps)
        sizes = [len(st.transfers) for st in steps]
        self.sizes = sizes
        self.first = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        n_flows = int(self.first[-1])
        self.flow_step = np.repeat(np.arange(n_steps), sizes)
        self.flow_bytes = np.array(
            [t.nbytes for st in steps for t in st.transfers], dtype=np.float64
        )
        flow_cap = np.array([t.rate * 1e9 for st in steps for t in st.transfers], dtype=np.float64)
        path_len = [len(t.path) for st in steps for t in st.transfers]
        entry_flow = np.repeat(np.arange(n_flows), path_len)
        entry_link = np.fromiter(
            (lid for st in steps for t in st.transfers for lid in t.path),
            dtype=np.int64,
            count=int(sum(path_len)),
        )
        n_links = len(sim.link_cap)
        if len(entry_link) and (entry_link.min() < 0 or entry_link.max() >= n_links):
            raise ScheduleError("a transfer's path names a link the topology does not have")
        self.net = _Incidence(n_flows, entry_flow, entry_link, sim.link_cap, flow_cap)

        deps = [schedule.dependencies(s) for s in range(n_steps)]
        self.waiting = np.array([len(d) for d in deps])
        self.dependents: list[list[int]] = [[] for _ in range(n_steps)]
        for s, ds in enumerate(deps):
            for d in ds:
                if not 0 <= d < s:
                    raise ScheduleError(f"step {s}: dependency {d} is not an earlier step")
                self.dependents[d].append(s)
        self.has_dependents = np.array([bool(d) for d in self.dependents], dtype=bool)
        network = sim.network
        self.overhead = [
            network.barrier_s if st.overhead is None else float(st.overhead) for st in steps
        ]
        self._signals(schedule)
        self.flow_src = np.array([t.src for st in steps for t in st.transfers], dtype=np.int64)
        crosses_nic = np.bincount(
            entry_flow, weights=sim.through_nic[entry_link], minlength=n_flows
        )
        self.flow_latency = np.where(crosses_nic > 0, network.latency_net_s, network.latency_pcie_s)
        self.post_free = np.zeros(schedule.ranks)  # when each sender's last post is issued
        self.posts: list[np.ndarray] = []  # flows of every post, by post id
        self._contention(sim, steps, flow_cap)

        self.step_start = np.full(n_steps, np.nan)
        self.step_end = np.full(n_steps, np.nan)
        self.transfer_end = np.full(n_flows, np.nan)
        self.left_in_step = np.array(sizes, dtype=np.int64)
        self.step_last = np.full(n_steps, -np.inf)  # latest end so far of each step's transfers
        self.finished_steps = 0
        # (time, kind, id): kind 0 starts step id, 1 ends post id (its flows start moving),
        # 2 makes flow id ready (its signals arrived)
        self.events: list[tuple[float, int, int]] = []
        for s in range(n_steps):
            if self.waiting[s] == 0:
                heapq.heappush(self.events, (self.overhead[s], 0, s))

        # per flow: rate, bytes left at time `since`, when it began moving, its projected finish
        # and the time from which it counts as finished (bytes left within tolerance); `live`
        # lists the flows moving now, `active` marks them
        self.live = np.zeros(0, dtype=np.int64)
        self.active = np.zeros(n_flows, dtype=bool)
        self.rate = np.zeros(n_flows)
        self.left = self.flow_bytes.copy()
        self.since = np.zeros(n_flows)
        self.began = np.zeros(n_flows)
        self.finish = np.full(n_flows, np.inf)
        self.done_from = np.full(n_flows, np.inf)
        self.load = np.zeros(n_links + 1)  # per link: total rate of the live flows
        self.refill_from = np.inf  # flows at this rate or above need new rates; inf: none
        self.solves = 0

    def _signals(self, schedule: Schedule) -> None:
        """Index the ``after`` references: per flow, how many it waits for, when the last
        arrived signal lets it go, and which flows wait for it."""
        first = self.first
        n_flows = int(first[-1])
        self.signal_wait = np.zeros(n_flows, dtype=np.int64)
        self.signal_ready = np.zeros(n_flows)
        self.signal_dependents: list[list[int]] = [[] for _ in range(n_flows)]
        flow = 0
        for s, st in enumerate(schedule.steps):
            for k, t in enumerate(st.transfers):
                for a, b in t.after:
                    if not (0 <= a < len(schedule.steps) and 0 <= b < first[a + 1] - first[a]):
                        raise ScheduleError(f"step {s} transfer {k}: no transfer ({a}, {b})")
                    dep = int(first[a] + b)
                    if dep >= flow:
                        raise ScheduleError(
                            f"step {s} transfer {k}: waits for ({a}, {b}), not an earlier transfer"
                        )
                    self.signal_dependents[dep].append(flow)
                self.signal_wait[flow] = len(t.after)
                flow += 1
        self.signalled = self.signal_wait > 0
        self.has_signal_dependents = np.array([bool(d) for d in self.signal_dependents], bool)
        self.step_started = np.zeros(n_flows, dtype=bool)

    def _contention(self, sim: FluidSimulator, steps: list, flow_cap: np.ndarray) -> None:
        """Per-link state of the contention model: each link's class, and the count, summed
        rate caps and peer-to-peer count of the flows on it."""
        self.contended = sim.network.contended
        if not self.contended:
            return
        names = list(LINK_CLASSES)
        self.class_links = {
            name: np.flatnonzero(sim.link_class == k) for k, name in enumerate(names)
        }
        staged = np.array([t.staged for st in steps for t in st.transfers], dtype=bool)
        self.p2p_weight = (~staged).astype(np.float64)
        self.flow_cap = flow_cap
        n = len(sim.link_cap) + 1
        self.on_link = np.zeros(n)
        self.cap_on_link = np.zeros(n)
        self.p2p_on_link = np.zeros(n)
        self._trigger(sim, steps)

    def _trigger(self, sim: FluidSimulator, steps: list) -> None:
        """The posted-write trigger's state: per flow the (uplink, target root complex) of its
        pushed writes (CSR by flow), and per uplink how many live flows write to each root
        complex. Off where the model has no trigger or a node has a single root complex."""
        self.trigger_factor = sim.network.trigger_factor_for(sim.topology)
        ports = sim.root_ports
        if self.trigger_factor is None or ports.complexes < 2:
            self.trigger_factor = None
            return
        writes = [ports.writes(t.path, t.staged, t.pull) for st in steps for t in st.transfers]
        self.write_ptr = np.concatenate([[0], np.cumsum([len(w) for w in writes])]).astype(np.int64)
        flat = np.array([pair for w in writes for pair in w], dtype=np.int64).reshape(-1, 2)
        self.write_uplink, self.write_target = flat[:, 0], flat[:, 1]
        self.writes_to = np.zeros((ports.uplinks, ports.complexes))
        self.uplink_link = ports.uplink_links

    def _recount(self, flows: np.ndarray, sign: float) -> None:
        """Add (sign 1) or remove (-1) ``flows`` from the links they cross and set every link's
        delivered capacity (:func:`delivered_capacity`)."""
        if not self.contended or not len(flows):
            return
        net = self.net
        self.on_link += sign * net.link_sums(flows, np.ones(len(flows)))
        self.cap_on_link += sign * net.link_sums(flows, self.flow_cap[flows])
        self.p2p_on_link += sign * net.link_sums(flows, self.p2p_weight[flows])
        triggered = None
        if self.trigger_factor is not None:
            entries = _gather(self.write_ptr, np.arange(self.write_ptr[-1]), flows)
            np.add.at(
                self.writes_to, (self.write_uplink[entries], self.write_target[entries]), sign
            )
            triggered = np.zeros(len(self.sim.link_cap), dtype=bool)
            triggered[self.uplink_link] = (self.writes_to > 0.5).sum(axis=1) >= 2
        net.cap[:-1] = delivered_capacity(
            self.sim.network,
            self.class_links,
            self.sim.link_cap,
            self.on_link[:-1],
            self.cap_on_link[:-1],
            self.p2p_on_link[:-1],
            triggered,
            self.trigger_factor or 1.0,
        )

    # ----- rates ----------------------------------------------------------------------------
    def refill(self, t: float) -> None:
        """Recompute the fair rates at time ``t`` after flows started or finished.

        Progressive filling freezes flows in increasing order of rate, and the rounds below the
        lowest rate of a departed flow saturated only links it does not cross: flows slower than
        that keep their rates, and filling resumes with the others on the capacity they leave.
        """
        level = self.refill_from
        self.refill_from = np.inf
        self.solves += 1
        if level <= 0:
            free = self.live
            residual = self.net.cap.copy()
        else:
            free = self.live[self.rate[self.live] >= level * (1 - 1e-9)]
            residual = self.net.cap - self.load + self.net.link_sums(free, self.rate[free])
        old = self.rate[free]
        self.net.fill(free, residual, self.rate)
        new = self.rate[free]
        self.load += self.net.link_sums(free, new - old)
        left = self.left[free] - old * (t - self.since[free])
        self.left[free] = left
        self.since[free] = t
        with np.errstate(divide="ignore", invalid="ignore"):
            self.finish[free] = t + left / new
            self.done_from[free] = t + (left - _REL * self.flow_bytes[free] - 1e-6) / new

    # ----- retiring -------------------------------------------------------------------------
    def batch(self, t_done: float, t_limit: float) -> tuple[np.ndarray, np.ndarray, float]:
        """The flows to retire next, their end times, and the time rates change.

        Exact (``coalesce`` = 0): the flows finishing at ``t_done``, all ending then.
        Coalescing: see :class:`FluidSimulator`; ``t_limit`` is the next step start.
        """
        live = self.live
        finish = self.finish[live]
        batch, t_next = self._coalesce(t_done, t_limit, finish)
        spacing = 4 * np.spacing(t_next)
        due = (self.done_from[live] <= t_next) | (finish <= t_next + spacing)
        self.active[batch] = False  # set aside: not due twice
        due = live[due & self.active[live]]
        self.active[batch] = True
        done = np.concatenate([batch, due])
        ends = np.concatenate([self.finish[batch], np.minimum(self.finish[due], t_next)])
        return done, ends, t_next

    def _coalesce(
        self, t_done: float, t_limit: float, finish: np.ndarray
    ) -> tuple[np.ndarray, float]:
        """The flows retired together at their own ends, and the time rates change."""
        eps = self.sim.coalesce
        none = np.zeros(0, dtype=np.int64)
        if eps <= 0 or t_done >= t_limit:
            return none, t_done
        first = self.live[int(finish.argmin())]
        reach = min(t_done + eps * (t_done - self.began[first]), t_limit)
        cand = self.live[finish <= reach]
        if len(cand) <= 1:
            return none, t_done
        fin = self.finish[cand]
        order = np.argsort(fin, kind="stable")
        cand, fin = cand[order], fin[order]
        flight = eps * (fin - self.began[cand])
        # every flow retired must end within ε × its flight time of the time rates change, which
        # lies between the first and the last of their ends
        ok = (fin <= np.minimum.accumulate(fin + flight)) & (fin - t_done <= flight)
        # stop after a transfer that completes a step others wait for, or that others wait for
        ok[1:] &= ~(self._completes_step(cand[:-1]) | self.has_signal_dependents[cand[:-1]])
        last = len(cand) - 1 if ok.all() else int(ok.argmin()) - 1
        rate = self.rate[cand[: last + 1]]
        # the rate-weighted mean end: the capacity idled by flows ending before it matches, to
        # first order, the capacity the flows ending after it stop using early
        mean = float(rate @ fin[: last + 1]) / float(rate.sum())
        if math.isnan(mean):  # flows of unbounded rate
            mean = t_done
        return cand[: last + 1], min(max(mean, t_done), float(fin[last]))

    def _completes_step(self, cand: np.ndarray) -> np.ndarray:
        """For flows in finishing order: does retiring them up to each one complete a step that
        other steps wait for?"""
        steps = self.flow_step[cand]
        order = np.argsort(steps, kind="stable")
        ordered = steps[order]
        starts = np.flatnonzero(np.concatenate([[True], ordered[1:] != ordered[:-1]]))
        lens = np.diff(np.append(starts, len(cand)))
        rank = np.empty(len(cand), dtype=np.int64)
        rank[order] = np.arange(len(cand)) - np.repeat(starts, lens)
        return (rank + 1 == self.left_in_step[steps]) & self.has_dependents[steps]

    def retire(self, done: np.ndarray, ends: np.ndarray) -> None:
        """Retire the flows ``done``, whose last bytes left at times ``ends``."""
        self.refill_from = min(self.refill_from, float(self.rate[done].min()))
        self.active[done] = False
        self.live = self.live[self.active[self.live]]
        if len(self.live):
            self.load -= self.net.link_sums(done, self.rate[done])
        else:  # start afresh rather than carry rounding
            self.load[:] = 0.0
        self._recount(done, -1.0)
        self.rate[done] = 0.0
        self.left[done] = 0.0
        self.finish[done] = np.inf
        self.done_from[done] = np.inf
        self.ended(done, ends + self.flow_latency[done])

    def ended(self, flows: np.ndarray, ends: np.ndarray) -> None:
        """``flows`` ended (latency included) at ``ends``: release the flows that wait for their
        signals and finish the steps they complete."""
        self.transfer_end[flows] = ends
        sigma = self.sim.network.signal_s
        for f in flows[self.has_signal_dependents[flows]]:
            when = float(self.transfer_end[f]) + sigma
            for g in self.signal_dependents[f]:
                self.signal_wait[g] -= 1
                self.signal_ready[g] = max(self.signal_ready[g], when)
                if self.signal_wait[g] == 0 and self.step_started[g]:
                    heapq.heappush(self.events, (float(self.signal_ready[g]), 2, g))
        steps, inverse, counts = np.unique(
            self.flow_step[flows], return_inverse=True, return_counts=True
        )
        np.maximum.at(self.step_last, steps[inverse], ends)
        for s, k in zip(steps, counts, strict=True):
            self.left_in_step[s] -= k
            if self.left_in_step[s] == 0:
                self.finish_step(int(s), float(self.step_last[s]))

    def finish_step(self, s: int, when: float) -> None:
        """Step ``s`` ended at ``when``: schedule the steps waiting for it."""
        self.step_end[s] = when
        self.finished_steps += 1
        for nxt in self.dependents[s]:
            self.waiting[nxt] -= 1
            if self.waiting[nxt] == 0:
                heapq.heappush(self.events, (when + self.overhead[nxt], 0, nxt))

    def post(self, src: int, t: float, flows: np.ndarray) -> None:
        """``src`` posts ``flows`` at ``t``: after its earlier posts, the issue overhead o."""
        begin = max(t, float(self.post_free[src])) if self.sim.network.serial_issue else t
        self.post_free[src] = begin + self.sim.network.issue_s
        heapq.heappush(self.events, (float(self.post_free[src]), 1, len(self.posts)))
        self.posts.append(flows)

    def start_step(self, s: int, t: float) -> None:
        """Step ``s`` starts: its senders post its barrier transfers, one group per sender;
        its signal-driven transfers go when their signals have arrived."""
        self.step_start[s] = t
        if self.sizes[s] == 0:
            self.finish_step(s, t)
            return
        idx = np.arange(self.first[s], self.first[s + 1])
        self.step_started[idx] = True
        waits = self.signalled[idx]
        for f in idx[waits]:
            if self.signal_wait[f] == 0:
                heapq.heappush(self.events, (max(t, float(self.signal_ready[f])), 2, int(f)))
        barrier = idx[~waits]
        if len(barrier):
            src = self.flow_src[barrier]
            order = np.argsort(src, kind="stable")
            senders, cuts = np.unique(src[order], return_index=True)
            for sender, group in zip(senders, np.split(barrier[order], cuts[1:]), strict=True):
                self.post(int(sender), t, group)

    def activate(self, flows: np.ndarray, t: float) -> None:
        """``flows`` start moving data at ``t`` (empty ones end at once)."""
        zero = self.flow_bytes[flows] <= 0
        moving = flows[~zero]
        self.live = np.concatenate([self.live, moving])
        self.active[moving] = True
        self.since[moving] = t
        self.began[moving] = t
        self.refill_from = 0.0
        self._recount(moving, 1.0)
        if zero.any():
            empty = flows[zero]
            self.ended(empty, t + self.flow_latency[empty])

    def start_due(self, t: float) -> None:
        """Handle the events due by ``t``: step starts, posts issued, signals arrived."""
        while self.events and self.events[0][0] <= t:
            when, kind, ident = heapq.heappop(self.events)
            if kind == 0:
                self.start_step(ident, when)
            elif kind == 1:
                self.activate(self.posts[ident], when)
            else:
                self.post(int(self.flow_src[ident]), when, np.array([ident]))

    # ----- the loop -------------------------------------------------------------------------
    def result(self) -> SimResult:
        """Run the simulation to the end."""
        record = self.sim.record_links
        throughput: list[tuple[float, float, float]] = []
        load_times: list[tuple[float, float]] = []
        loads: list[np.ndarray] = []
        n_steps = len(self.sizes)
        t = 0.0
        no_flows = np.zeros(0, dtype=np.int64)
        while self.finished_steps < n_steps:
            if self.refill_from < np.inf:
                self.refill(t)
            t_done = float(self.finish[self.live].min()) if len(self.live) else np.inf
            t_event = self.events[0][0] if self.events else np.inf
            if not min(t_done, t_event) < np.inf:
                raise ScheduleError("simulation stalled: transfers remain but none can progress")
            if t_done <= t_event:
                done, ends, t_next = self.batch(t_done, t_event)
            else:
                done, ends, t_next = no_flows, no_flows, t_event
            if t_next > t and len(self.live):
                moving = self.live
                # what each flow moves in [t, t_next]: a flow retired early stops at its end
                until = np.minimum(self.finish[moving], t_next)
                weight = self.rate[moving] * (until - t) / (t_next - t)
                throughput.append((t, t_next, float(weight.sum()) / 1e9))
                if record:
                    load_times.append((t, t_next))
                    loads.append(self.net.link_sums(moving, weight)[:-1] / 1e9)
            t = t_next
            if len(done):
                self.retire(done, ends)
            self.start_due(t)
        link_load = None
        if record:
            intervals = np.array(load_times).reshape(-1, 2)
            n_links = len(self.sim.link_cap)
            link_load = (intervals, np.array(loads) if loads else np.zeros((0, n_links)))
        return SimResult(
            completion_s=float(np.nanmax(self.step_end)) if n_steps else 0.0,
            step_start=self.step_start,
            step_end=self.step_end,
            transfer_end=self.transfer_end,
            total_bytes=int(self.schedule.served().sum()),
            ranks=self.schedule.ranks,
            throughput=throughput,
            link_load=link_load,
            events=self.solves,
            network=self.sim.network.name,
        )


def simulate(
    schedule: Schedule,
    topo: Topology,
    network: NetworkModel | str = PCIE,
    coalesce: float = DEFAULT_COALESCE,
) -> SimResult:
    """Convenience wrapper: simulate one schedule."""
    return FluidSimulator(topo, network, coalesce=coalesce).run(schedule)
