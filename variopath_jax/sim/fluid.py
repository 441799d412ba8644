"""Event-driven fluid network simulator (DESIGN.md "Simulator").

Transfers active at the same time share every directed link they cross by max-min fairness,
computed by progressive filling whenever a transfer starts or ends; each transfer is also capped
by its path rate. A step starts when the steps it depends on have finished, plus its overhead λ;
its transfers begin moving data α after the step starts (per-transfer latency). Endpoint GPU
links are links like any other here. Contention-free schedules therefore run at their path rates
and finish at exactly Σ_k (λ + α + max_i x_ki / bw) (paper Eq. 2 plus α per step).

The hot loop is vectorised over (transfer, link) incidence entries with numpy; transfers that
finish at the same instant are retired together.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import numpy as np

from variopath_jax.schedule import Schedule, ScheduleError
from variopath_jax.topology import Topology

# Shared model defaults for every scheduler (DESIGN.md: "the same λ and α for everyone").
# λ, the per-step overhead: the synchronisation that separates two steps. The paper's runtime
# avoids ~20 µs global barriers with double-buffered, signal-based steps and reports 7.9 µs P50
# for a whole 1 KiB transfer between two RTX 5090 servers (§5), which includes the transfer's own
# latency; we take λ = 5 µs per step.
DEFAULT_LAMBDA_S = 5e-6
# α, per-transfer latency: PCIe P2P latency is 0.4-1.4 µs and RDMA a few µs
# (research/topology-formats.md §4.3); we take 2 µs.
DEFAULT_ALPHA_S = 2e-6

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
        Aggregate data rate over every interval of constant rates.
    link_load : tuple of (intervals, loads) or None
        With ``record_links``: the (E, 2) start/end times of every interval with traffic and the
        (E, L) load of every link during it, in GB/s.
    """

    completion_s: float
    step_start: np.ndarray
    step_end: np.ndarray
    transfer_end: np.ndarray
    total_bytes: int
    ranks: int
    throughput: list[tuple[float, float, float]] = field(default_factory=list)
    link_load: tuple[np.ndarray, np.ndarray] | None = None

    @property
    def algbw_gbps(self) -> float:
        """The paper's metric: total payload / (N × completion time), in GB/s."""
        if self.completion_s <= 0:
            return 0.0
        return self.total_bytes / (self.ranks * self.completion_s) / 1e9


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
    rate = np.zeros(len(flow_cap))
    unfrozen = active.copy()
    residual = link_cap.astype(np.float64).copy()
    level = 0.0
    n_links = len(link_cap)
    while unfrozen.any():
        live = unfrozen[entry_flow]
        count = np.bincount(entry_link[live], minlength=n_links)
        used = count > 0
        step = np.inf
        if used.any():
            step = float((residual[used] / count[used]).min())
        step = min(step, float(flow_cap[unfrozen].min()) - level)
        step = max(step, 0.0)
        level += step
        residual -= step * count
        saturated = used & (residual <= _REL * link_cap)
        freeze = unfrozen & (flow_cap <= level * (1 + _REL))
        hit = entry_flow[live & saturated[entry_link]]
        freeze[hit] = True
        rate[freeze] = level
        unfrozen &= ~freeze
    return rate


class FluidSimulator:
    """Simulates schedules on one topology.

    Parameters
    ----------
    topo : Topology
    alpha_s : float
        Per-transfer latency α (seconds).
    record_links : bool
        Keep per-link loads over time (memory grows with events × links).
    """

    def __init__(
        self, topo: Topology, alpha_s: float = DEFAULT_ALPHA_S, record_links: bool = False
    ) -> None:
        if alpha_s < 0:
            raise ScheduleError(f"alpha must be >= 0, got {alpha_s}")
        self.topology = topo
        self.alpha_s = alpha_s
        self.record_links = record_links
        self.link_cap = np.array([lk.gbs * 1e9 for lk in topo.graph.links])

    def run(self, schedule: Schedule) -> SimResult:
        if schedule.fingerprint != self.topology.fingerprint:
            raise ScheduleError(
                f"schedule is for topology {schedule.fingerprint}, simulator for {self.topology.fingerprint}"
            )
        steps = schedule.steps
        n_steps = len(steps)
        sizes = [len(st.transfers) for st in steps]
        first = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        n_flows = int(first[-1])
        flow_step = np.repeat(np.arange(n_steps), sizes)
        flow_bytes = np.array([t.nbytes for st in steps for t in st.transfers], dtype=np.float64)
        flow_cap = np.array([t.rate * 1e9 for st in steps for t in st.transfers], dtype=np.float64)
        path_len = [len(t.path) for st in steps for t in st.transfers]
        entry_flow = np.repeat(np.arange(n_flows), path_len)
        entry_link = np.fromiter(
            (lid for st in steps for t in st.transfers for lid in t.path),
            dtype=np.int64,
            count=int(sum(path_len)),
        )
        if len(entry_link) and (entry_link.min() < 0 or entry_link.max() >= len(self.link_cap)):
            raise ScheduleError("a transfer's path names a link the topology does not have")

        deps = [schedule.dependencies(s) for s in range(n_steps)]
        waiting = np.array([len(d) for d in deps])
        dependents: list[list[int]] = [[] for _ in range(n_steps)]
        for s, ds in enumerate(deps):
            for d in ds:
                if not 0 <= d < s:
                    raise ScheduleError(f"step {s}: dependency {d} is not an earlier step")
                dependents[d].append(s)

        step_start = np.full(n_steps, np.nan)
        step_end = np.full(n_steps, np.nan)
        transfer_end = np.full(n_flows, np.nan)
        left_in_step = np.array(sizes, dtype=np.int64)
        remaining = flow_bytes.copy()
        active = np.zeros(n_flows, dtype=bool)
        events: list[
            tuple[float, int, int]
        ] = []  # (time, kind 0=start step / 1=activate flows, step)
        for s in range(n_steps):
            if waiting[s] == 0:
                heapq.heappush(events, (schedule.overhead(s), 0, s))

        t = 0.0
        rates = np.zeros(n_flows)
        dirty = False
        throughput: list[tuple[float, float, float]] = []
        load_times: list[tuple[float, float]] = []
        loads: list[np.ndarray] = []
        finished_steps = 0

        def finish_step(s: int, when: float) -> None:
            nonlocal finished_steps
            step_end[s] = when
            finished_steps += 1
            for nxt in dependents[s]:
                waiting[nxt] -= 1
                if waiting[nxt] == 0:
                    heapq.heappush(events, (when + schedule.overhead(nxt), 0, nxt))

        while finished_steps < n_steps:
            if dirty:
                rates = max_min_rates(active, flow_cap, entry_flow, entry_link, self.link_cap)
                dirty = False
            t_done = np.inf
            finish = None
            if active.any():
                with np.errstate(divide="ignore", over="ignore"):
                    finish = np.where(active, t + remaining / np.maximum(rates, 1e-300), np.inf)
                t_done = float(finish.min())
            t_event = events[0][0] if events else np.inf
            t_next = min(t_done, t_event)
            if not np.isfinite(t_next):
                raise ScheduleError("simulation stalled: transfers remain but none can progress")
            if t_next > t and active.any():
                throughput.append((t, t_next, float(rates[active].sum()) / 1e9))
                if self.record_links:
                    load_times.append((t, t_next))
                    loads.append(
                        np.bincount(
                            entry_link,
                            weights=(rates * active)[entry_flow],
                            minlength=len(self.link_cap),
                        )
                        / 1e9
                    )
                remaining[active] -= rates[active] * (t_next - t)
            t = t_next
            # retire every transfer that is done now
            if active.any():
                # done: no bytes left, or due to finish within the clock's resolution at t
                # (a sliver of bytes can need less time than a float can add to t)
                done = active & (remaining <= _REL * flow_bytes + 1e-6)
                if finish is not None:
                    done |= active & (finish <= t + 4 * np.spacing(t))
                if done.any():
                    remaining[done] = 0.0
                    active &= ~done
                    transfer_end[done] = t
                    dirty = True
                    for s, k in zip(*np.unique(flow_step[done], return_counts=True), strict=True):
                        left_in_step[s] -= k
                        if left_in_step[s] == 0:
                            finish_step(int(s), t)
            # start steps and activate transfers due now
            while events and events[0][0] <= t:
                when, kind, s = heapq.heappop(events)
                if kind == 0:
                    step_start[s] = when
                    if sizes[s] == 0:
                        finish_step(s, when)
                    else:
                        heapq.heappush(events, (when + self.alpha_s, 1, s))
                else:
                    idx = slice(first[s], first[s + 1])
                    zero = flow_bytes[idx] <= 0
                    active[idx] = ~zero
                    transfer_end[idx][zero] = when
                    if zero.any():
                        left_in_step[s] -= int(zero.sum())
                        if left_in_step[s] == 0:
                            finish_step(s, when)
                    dirty = True
        link_load = None
        if self.record_links:
            intervals = np.array(load_times).reshape(-1, 2)
            link_load = (intervals, np.array(loads) if loads else np.zeros((0, len(self.link_cap))))
        return SimResult(
            completion_s=float(np.nanmax(step_end)) if n_steps else 0.0,
            step_start=step_start,
            step_end=step_end,
            transfer_end=transfer_end,
            total_bytes=int(schedule.served().sum()),
            ranks=schedule.ranks,
            throughput=throughput,
            link_load=link_load,
        )


def simulate(schedule: Schedule, topo: Topology, alpha_s: float = DEFAULT_ALPHA_S) -> SimResult:
    """Convenience wrapper: simulate one schedule."""
    return FluidSimulator(topo, alpha_s).run(schedule)
