"""The analytic predictor of ``variopath``'s choice (issue 28 item 1; docs/planner.md "The
analytic predictor").

The candidate plans were once predicted by simulating each under every model; planning is on the
critical path of every call, so ``variopath`` now predicts them in closed form under the same
network model (docs/simulator.md), one pass over the transfers:

- **Step and post semantics are kept exactly**: a barrier step starts λ (or its own overhead)
  after the steps it depends on; a sender posts a barrier step's transfers as one group and each
  signal-driven transfer on its own, its posts serialised at o each; a signal-driven transfer is
  ready σ after the last transfer it waits for; a transfer ends its latency L after its last byte.
- **Data time per transfer.** A transfer runs at its rate cap unless a link it crosses is
  *oversubscribed* by its step's barrier transfers (their caps add up to more than the link
  carries, or the link's class does not share paced flows losslessly and two or more cross it,
  :func:`~variopath_jax.sim.fluid.delivered_capacity`); then it takes at least that link's
  load over its delivered capacity C · η(k), or C · factor on an uplink whose transfers push
  writes toward two or more root complexes (the posted-write trigger, ``sim.RootPorts``).
  Signal-driven transfers are taken at their caps, or their share of what a link delivers
  beside the transfers still moving on it (:func:`_shared_time`): the plans that use them
  (signal-driven channels, the hybrid plans' chains and phases, ``rot-paced``'s phases) keep
  their links to one flow, to caps that fit, or to one root complex written at a time.

It is **exact** for a sequence of contention-free channel activations (the paper's Eq. 2 plus o
and L per step) and for a paced step whose caps fit every link it crosses (its horizon plus
λ + o + L), so also for signal-driven activations, which overlap only where they share no link
(``schedule.signal_driven``); for an oversubscribed step it is the link bound, max over links of
load / (C η(k)), which ignores that η rises as flows finish and that max-min sharing may leave a
bottleneck idle.
``benchmarks/bench_predictor.py`` prints predicted ÷ simulated on every bench point.

**One step without signals** (the concurrent families and the paced plan) needs no events:
every sender posts its one group at λ, so the plan ends at λ + o + the largest data time plus
latency, and that is max(the largest own time plus latency, per link its bound plus the latency
of the transfers crossing it). :func:`tally` sums what that needs once per plan, independent of
the model; :func:`predict_tally` evaluates it per model in one pass over the links.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from variopath_jax.schedule import Schedule, Transfer
from variopath_jax.sim.fluid import delivered_capacity
from variopath_jax.sim.network import (
    LINK_CLASSES,
    NetworkModel,
    RootPorts,
    link_classes,
    through_nic,
)
from variopath_jax.topology import Topology


@dataclass(frozen=True)
class Links:
    """What the predictor needs of a topology's links: capacity (B/s), contention class,
    whether a transfer crossing it pays the network latency, and where the posted-write trigger
    is watched (``ports``, of ``topo``)."""

    cap: np.ndarray
    class_links: dict[str, np.ndarray]
    through_nic: np.ndarray
    ports: RootPorts
    topo: Topology

    @classmethod
    def of(cls, topo: Topology) -> Links:
        """The links of ``topo``."""
        klass = link_classes(topo)
        return cls(
            np.array([lk.gbs * 1e9 for lk in topo.graph.links], dtype=np.float64),
            {name: np.flatnonzero(klass == k) for k, name in enumerate(LINK_CLASSES)},
            through_nic(topo),
            RootPorts(topo),
            topo,
        )

    def trigger_factor(self, network: NetworkModel) -> float | None:
        """What a triggered uplink keeps under ``network`` (``trigger_factor_for``), None where
        nothing triggers (no trigger, or one root complex a node: sim/fluid.py ``_Run._trigger``;
        ffi/choice.cc ``ChoiceCore::trigger_factor``)."""
        if self.ports.complexes < 2:
            return None
        return network.trigger_factor_for(self.topo)


def writes_on(tr: Transfer, links: Links) -> dict[int, int]:
    """Per uplink (a link id) on which ``tr`` pushes writes, the root complex they go to
    (``RootPorts.writes``)."""
    ports = links.ports
    return {
        int(ports.uplink_links[up]): target
        for up, target in ports.writes(tr.path, tr.staged, tr.pull)
    }


def _targets(transfers, links: Links) -> np.ndarray:
    """Per link, the root complexes ``transfers`` push writes toward on it, as a bitmask (bit c:
    root complex c; ffi/choice.h ``LinkSums::targets``)."""
    out = np.zeros(len(links.cap), dtype=np.uint64)
    if links.ports.complexes < 2:
        return out
    for t in transfers:
        for lid, target in writes_on(t, links).items():
            out[lid] |= np.uint64(1 << target)
    return out


def _triggered(targets: np.ndarray) -> np.ndarray:
    """Per link: does its bitmask name two or more root complexes."""
    return (targets & (targets - np.uint64(1))) != 0


def data_times(schedule: Schedule, links: Links, network: NetworkModel) -> list[np.ndarray]:
    """Per step, every transfer's data time (s): its bytes at its rate cap, or over the delivered
    capacity of the slowest link its step's barrier transfers oversubscribe."""
    n_links = len(links.cap)
    out = []
    for st in schedule.steps:
        nbytes = np.array([t.nbytes for t in st.transfers], dtype=np.float64)
        cap = np.array([t.rate * 1e9 for t in st.transfers], dtype=np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            own = np.where(nbytes > 0, nbytes / cap, 0.0)
        barrier = [k for k, t in enumerate(st.transfers) if not t.after]
        if barrier:
            lens = [len(st.transfers[k].path) for k in barrier]
            flow = np.repeat(np.asarray(barrier), lens)
            link = np.fromiter(
                (lid for k in barrier for lid in st.transfers[k].path), np.int64, sum(lens)
            )
            flows = np.bincount(link, minlength=n_links).astype(np.float64)
            load = np.bincount(link, weights=nbytes[flow], minlength=n_links)
            cap_sum = np.bincount(link, weights=cap[flow], minlength=n_links)
            staged = np.array([st.transfers[k].staged for k in barrier], dtype=np.float64)
            p2p = np.bincount(link, weights=1.0 - np.repeat(staged, lens), minlength=n_links)
            factor = links.trigger_factor(network)
            triggered = (
                None
                if factor is None
                else _triggered(_targets([st.transfers[k] for k in barrier], links))
            )
            delivered = delivered_capacity(
                network, links.class_links, links.cap, flows, cap_sum, p2p, triggered, factor or 1.0
            )
            over = delivered < links.cap * (1 - 1e-12)
            over |= (cap_sum > links.cap * (1 + 1e-9)) & (flows >= 2)
            bound = np.where(over & (flows > 0), load / np.maximum(delivered, 1e-30), 0.0)
            np.maximum.at(own, flow, bound[link])
        out.append(own)
    return out


@dataclass(frozen=True)
class Tally:
    """A one-step plan without signals as its prediction needs it, under any model: per link its
    transfers' count, bytes, summed caps (B/s) and peer-to-peer count, whether a transfer through
    a NIC (``nic``) or one not (``pcie``) crosses it; the largest own time (bytes at the cap) of
    the transfers through a NIC and of the others (-inf: none); the step's overhead (None: λ);
    per link the root complexes its transfers push writes toward (a bitmask, :func:`_targets`)."""

    flows: np.ndarray
    load: np.ndarray
    cap_sum: np.ndarray
    p2p: np.ndarray
    nic: np.ndarray
    pcie: np.ndarray
    own_nic: float
    own_pcie: float
    overhead: float | None
    targets: np.ndarray


def tally(schedule: Schedule, links: Links) -> Tally | None:
    """The tally of ``schedule`` if it is one step of transfers that wait for no signal, else
    None."""
    if len(schedule.steps) != 1 or not schedule.steps[0].transfers:
        return None
    if any(t.after for t in schedule.steps[0].transfers):
        return None
    st = schedule.steps[0]
    n_links = len(links.cap)
    nbytes = np.array([t.nbytes for t in st.transfers], dtype=np.float64)
    cap = np.array([t.rate * 1e9 for t in st.transfers], dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        own = np.where(nbytes > 0, nbytes / cap, 0.0)
    lens = [len(t.path) for t in st.transfers]
    flow = np.repeat(np.arange(len(st.transfers)), lens)
    link = np.fromiter((lid for t in st.transfers for lid in t.path), np.int64, sum(lens))
    staged = np.array([t.staged for t in st.transfers], dtype=np.float64)
    crosses_nic = np.zeros(len(st.transfers), dtype=bool)
    np.logical_or.at(crosses_nic, flow, links.through_nic[link])
    nic = np.zeros(n_links, dtype=bool)
    nic[link[crosses_nic[flow]]] = True
    pcie = np.zeros(n_links, dtype=bool)
    pcie[link[~crosses_nic[flow]]] = True
    return Tally(
        np.bincount(link, minlength=n_links).astype(np.float64),
        np.bincount(link, weights=nbytes[flow], minlength=n_links),
        np.bincount(link, weights=cap[flow], minlength=n_links),
        np.bincount(link, weights=1.0 - staged[flow], minlength=n_links),
        nic,
        pcie,
        float(own[crosses_nic].max(initial=-np.inf)),
        float(own[~crosses_nic].max(initial=-np.inf)),
        st.overhead,
        _targets(st.transfers, links),
    )


def predict_tally(t: Tally, links: Links, network: NetworkModel) -> float:
    """The predicted completion time (s) of a tallied plan under ``network`` (module docstring):
    λ + o + max(own time + L, per oversubscribed link its load over what it delivers + L)."""
    if not (t.own_nic > -np.inf or t.own_pcie > -np.inf):
        return 0.0  # no transfer: the plan has no step
    overhead = network.barrier_s if t.overhead is None else float(t.overhead)
    factor = links.trigger_factor(network)
    delivered = delivered_capacity(
        network,
        links.class_links,
        links.cap,
        t.flows,
        t.cap_sum,
        t.p2p,
        None if factor is None else _triggered(t.targets),
        factor or 1.0,
    )
    over = delivered < links.cap * (1 - 1e-12)
    over |= (t.cap_sum > links.cap * (1 + 1e-9)) & (t.flows >= 2)
    over &= t.flows > 0
    bound = np.where(over, t.load / np.maximum(delivered, 1e-30), 0.0)
    latency = np.maximum(
        np.where(t.nic, network.latency_net_s, -np.inf),
        np.where(t.pcie, network.latency_pcie_s, -np.inf),
    )
    end = max(
        t.own_nic + network.latency_net_s,
        t.own_pcie + network.latency_pcie_s,
        float((bound + latency)[over].max(initial=-np.inf)),
    )
    return overhead + network.issue_s + end


def predict(schedule: Schedule, links: Links, network: NetworkModel) -> float:
    """The predicted completion time (s) of ``schedule`` under ``network`` (module docstring):
    the step and post semantics of the simulator with each transfer's data time from
    :func:`data_times` (one step without signals: :func:`predict_tally`)."""
    if not schedule.steps:
        return 0.0
    one_step = tally(schedule, links)
    if one_step is not None:
        return predict_tally(one_step, links, network)
    return predict_events(schedule, links, network)


def predict_events(schedule: Schedule, links: Links, network: NetworkModel) -> float:
    """:func:`predict` by its events, for any schedule: steps start, transfers post, signals
    arrive, transfers end."""
    steps = schedule.steps
    if not steps:
        return 0.0
    duration = data_times(schedule, links, network)
    klass = np.full(len(links.cap), -1, dtype=np.int64)
    for k, name in enumerate(LINK_CLASSES):
        klass[links.class_links[name]] = k
    first = np.concatenate([[0], np.cumsum([len(st.transfers) for st in steps])]).astype(int)
    flow_step = np.repeat(np.arange(len(steps)), np.diff(first))
    latency = [
        np.array(
            [
                network.latency_net_s
                if links.through_nic[list(t.path)].any()
                else network.latency_pcie_s
                for t in st.transfers
            ]
        )
        for st in steps
    ]
    deps = [schedule.dependencies(s) for s in range(len(steps))]
    waiting = [len(d) for d in deps]
    dependents: list[list[int]] = [[] for _ in steps]
    for s, ds in enumerate(deps):
        for d in ds:
            dependents[d].append(s)
    overhead = [network.barrier_s if st.overhead is None else float(st.overhead) for st in steps]
    signal_wait = np.zeros(int(first[-1]), dtype=np.int64)
    signal_ready = np.zeros(int(first[-1]))
    signal_dependents: list[list[int]] = [[] for _ in range(int(first[-1]))]
    for s, st in enumerate(steps):
        for k, t in enumerate(st.transfers):
            for a, b in t.after:
                signal_dependents[int(first[a] + b)].append(int(first[s] + k))
            signal_wait[first[s] + k] = len(t.after)
    started = np.zeros(int(first[-1]), dtype=bool)
    left = np.diff(first).copy()
    step_end = np.zeros(len(steps))
    post_free = np.zeros(schedule.ranks)
    # (time, kind, id): 0 starts step id, 1 readies flow id (its signals arrived), 2 ends flow id
    events: list[tuple[float, int, int]] = [
        (overhead[s], 0, s) for s in range(len(steps)) if waiting[s] == 0
    ]
    heapq.heapify(events)

    # the flows moving on each link, kept only when a transfer waits for signals:
    # (end, cap, staged, B/s, the root complex it writes toward there or -1)
    track = any(t.after for st in steps for t in st.transfers)
    on_link: dict[int, list[tuple[float, float, bool, float, int]]] = {}
    factor = links.trigger_factor(network)

    def post(src: int, t: float, flows: list[int]) -> None:
        begin = max(t, float(post_free[src])) if network.serial_issue else t
        post_free[src] = begin + network.issue_s
        start = float(post_free[src])
        for f in flows:
            s, k = int(flow_step[f]), f - int(first[flow_step[f]])
            tr = steps[s].transfers[k]
            data = float(duration[s][k])
            writes = writes_on(tr, links) if track and factor is not None else {}
            if tr.after:
                data = max(data, _shared_time(tr, writes, start, on_link, links, klass, network))
            end = start + data
            speed = tr.nbytes / data if data > 0 else 0.0
            for lid in tr.path if track else ():
                entry = (end, tr.rate * 1e9, tr.staged, speed, writes.get(lid, -1))
                on_link.setdefault(lid, []).append(entry)
            if signal_dependents[f]:
                heapq.heappush(events, (end + float(latency[s][k]), 2, f))
            else:  # no transfer waits for it: it ends without an event
                ended(s, end + float(latency[s][k]))

    def finish_step(s: int, when: float) -> None:
        step_end[s] = when
        for nxt in dependents[s]:
            waiting[nxt] -= 1
            if waiting[nxt] == 0:
                heapq.heappush(events, (when + overhead[nxt], 0, nxt))

    def ended(s: int, when: float) -> None:
        step_end[s] = max(step_end[s], when)
        left[s] -= 1
        if left[s] == 0:
            finish_step(s, float(step_end[s]))

    while events:
        t, kind, ident = heapq.heappop(events)
        if kind == 0:
            st = steps[ident]
            if not st.transfers:
                finish_step(ident, t)
                continue
            groups: dict[int, list[int]] = {}
            for k, tr in enumerate(st.transfers):
                f = int(first[ident] + k)
                started[f] = True
                if tr.after:
                    if signal_wait[f] == 0:
                        heapq.heappush(events, (max(t, float(signal_ready[f])), 1, f))
                else:
                    groups.setdefault(tr.src, []).append(f)
            for src in sorted(groups):
                post(src, t, groups[src])
        elif kind == 1:
            s = int(flow_step[ident])
            post(steps[s].transfers[ident - int(first[s])].src, t, [ident])
        else:
            for g in signal_dependents[ident]:
                signal_wait[g] -= 1
                signal_ready[g] = max(signal_ready[g], t + network.signal_s)
                if signal_wait[g] == 0 and started[g]:
                    heapq.heappush(events, (float(signal_ready[g]), 1, g))
            ended(int(flow_step[ident]), t)
    return float(step_end.max())


def _shared_time(
    tr: Transfer,
    writes: dict[int, int],
    start: float,
    on_link: dict[int, list[tuple[float, float, bool, float, int]]],
    links: Links,
    klass: np.ndarray,
    network: NetworkModel,
) -> float:
    """A signal-driven transfer's data time when it starts at ``start`` beside the transfers
    still moving on its links (``writes``: where it pushes writes, :func:`writes_on`): while a
    link it crosses is oversubscribed or triggered (the rule of
    :func:`~variopath_jax.sim.fluid.delivered_capacity`) it moves at its fair share of what the
    link delivers, else at its cap; and it ends no earlier than the link, at what it delivers,
    carries its bytes and what the others have left (they slow down too). The transfers already
    moving keep their ends (a bounded estimate)."""
    live: dict[int, list[tuple[float, float, bool, float, int]]] = {}
    for lid in tr.path:
        moving = [x for x in on_link.get(lid, ()) if x[0] > start]
        on_link[lid] = moving
        if moving:
            live[lid] = moving
    own = tr.rate * 1e9
    if not live or tr.nbytes <= 0:
        return tr.nbytes / own if tr.nbytes > 0 else 0.0
    work = 0.0  # where a link collapses by flow count: its bytes left, at C η(k)
    for lid, moving in live.items():
        shared, strict, deliver = _share(tr, writes, moving, lid, links, klass, network)
        if strict and shared < own:
            left_bytes = tr.nbytes + sum(x[3] * (x[0] - start) for x in moving)
            work = max(work, left_bytes / deliver)
    ends = sorted({x[0] for moving in live.values() for x in moving})
    t, left = start, float(tr.nbytes)
    for until in ends:
        rate = own
        for lid, moving in live.items():
            now = [x for x in moving if x[0] > t]
            rate = min(rate, _share(tr, writes, now, lid, links, klass, network)[0])
        if left <= rate * (until - t):
            return max(t + left / rate - start, work)
        left -= rate * (until - t)
        t = until
    return max(t + left / own - start, work)


def _share(
    tr: Transfer,
    writes: dict[int, int],
    moving: list[tuple[float, float, bool, float, int]],
    lid: int,
    links: Links,
    klass: np.ndarray,
    network: NetworkModel,
) -> tuple[float, bool, float]:
    """The rate (B/s) ``tr`` gets on link ``lid`` beside the transfers ``moving`` on it, whether
    the link's rule charges by flow count (or the trigger fires), and what it delivers: where
    they oversubscribe it, the max-min level of their caps on C η(k) (a root link: the η of each
    rule that applies), on C · factor where their writes there go to two or more root complexes;
    else its cap. ffi/choice.cc ``share`` is its twin."""
    own = tr.rate * 1e9
    cap = float(links.cap[lid])
    if not moving:
        return own, False, cap
    k = len(moving) + 1
    cls = int(klass[lid])
    names = list(LINK_CLASSES)
    strict, eta = False, 1.0
    if cls >= 0 and names[cls] == "root_p2p":
        p2p = (not tr.staged) or any(not x[2] for x in moving)
        dma = tr.staged or any(x[2] for x in moving)
        eta = min(
            float(network.efficiency("root_dma", k)) if dma else 1.0,
            float(network.efficiency("root_p2p", k)) if p2p else 1.0,
        )
        strict = (p2p and not network.paced_lossless("root_p2p")) or (
            dma and not network.paced_lossless("root_dma")
        )
    elif cls >= 0:
        eta = float(network.efficiency(names[cls], k))
        strict = not network.paced_lossless(names[cls])
    factor = links.trigger_factor(network)
    targets = {writes.get(lid, -1), *(x[4] for x in moving)} - {-1}
    triggered = factor is not None and len(targets) >= 2
    caps = sorted([own, *(x[1] for x in moving)])
    over = sum(caps) > cap * (1 + 1e-9) or strict
    if not over and not triggered:
        return own, False, cap
    deliver = min(cap * eta if over else cap, cap * factor) if triggered else cap * eta
    strict = strict or triggered
    left = deliver
    for idx, c in enumerate(caps):  # progressive filling of the caps
        if c * (k - idx) > left:
            return min(own, left / (k - idx)), strict, deliver
        left -= c
    return own, strict, deliver
