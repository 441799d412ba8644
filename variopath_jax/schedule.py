"""The schedule IR every planner emits and every consumer reads (DESIGN.md "Schedule IR").

A schedule is a list of steps; a step holds transfers ``(src, dst, path, nbytes, carries=(i, j))``
where ``carries`` names the demand entry D[i][j] whose bytes move, so relays through an
intermediate GPU stay checkable. Two kinds of dependency order the transfers:

- **barrier steps**: a step starts once the steps it depends on have finished (by default the
  previous step) plus its overhead, the cost of a global barrier λ;
- **signals**: a transfer may also wait for individual earlier transfers (``after``, as
  ``(step, index)`` pairs), each ended plus the network model's signal cost σ. A signal-driven
  schedule (:func:`signal_driven`) has steps with no dependencies and no overhead whose lanes
  wait only for their sender's previous sends, their receiver's previous receives and, at a
  relay, the arrival of the bytes they forward.

A transfer starts when both hold. A *channel* schedule (VarioPath, paper §3) is a sequence of
activations: every step a partial permutation of direct transfers whose paths share no resource
in U.

Bytes are integers everywhere; times are seconds; rates GB/s (1e9 B/s).
"""

from __future__ import annotations

import dataclasses
import json
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path as FsPath
from typing import Any, overload

import numpy as np

from variopath_jax.errors import VarioPathError
from variopath_jax.topology import Topology

FORMAT = "variopath-schedule"
# 2 added Transfer.after and Transfer.staged, 3 Transfer.pull; earlier versions still load
VERSION = 3
_WIDTH = {1: 8, 2: 10, 3: 11}  # fields of a transfer row, per version


class ScheduleError(VarioPathError):
    """A schedule is malformed or does not serve its demand."""


@dataclass(frozen=True)
class Transfer:
    """Bytes of demand entry ``carries`` moving from ``src`` to ``dst`` along ``path``.

    ``rate`` is the rate cap in GB/s the transport enforces: the path's rate bw(p), or a lower
    pacing rate the schedule sets; ``cls`` the path class. ``staged``: the bytes bounce through
    host memory (SHM, or a NIC leg without GPUDirect RDMA), which a root complex serves as DMA to
    memory rather than as peer-to-peer. ``after``: earlier transfers, as ``(step, index)`` pairs,
    that must have ended (plus the signal cost) before this one starts. ``pull``: a peer-to-peer
    transfer within a node is a read by the receiver rather than a write by the sender (a
    push, the default, and the only kind every platform allows: Intel client CPUs do P2P writes
    only); pulled bytes never set off the posted-write trigger (sim/network.py). Transfers
    through a NIC or host memory are what RDMA and DMA make them, whatever ``pull`` says.
    """

    src: int
    dst: int
    path: tuple[int, ...]
    nbytes: int
    carries: tuple[int, int]
    rate: float
    cls: str = ""
    staged: bool = False
    after: tuple[tuple[int, int], ...] = ()
    pull: bool = False


@dataclass(frozen=True)
class Step:
    """Transfers that start together. ``deps`` = None means "the previous step";
    ``overhead`` = None means the schedule's λ."""

    transfers: tuple[Transfer, ...]
    deps: tuple[int, ...] | None = None
    overhead: float | None = None


class LazySteps(Sequence[Step]):
    """A schedule's steps, each built when it is first read and kept: a planner that holds its
    schedule as flat arrays (the C++ core's choice) hands the schedule over without building
    every :class:`Transfer` first, and whoever reads the steps (validation, simulation, JSON)
    builds them. Reads and compares as the list of its steps."""

    def __init__(self, count: int, build: Callable[[int], Step]) -> None:
        self._steps: list[Step | None] = [None] * count
        self._build = build

    def __len__(self) -> int:
        return len(self._steps)

    @overload
    def __getitem__(self, index: int) -> Step: ...
    @overload
    def __getitem__(self, index: slice) -> list[Step]: ...
    def __getitem__(self, index: int | slice) -> Step | list[Step]:
        if isinstance(index, slice):
            return [self[k] for k in range(*index.indices(len(self)))]
        k = operator.index(index)
        if k < 0:
            k += len(self)
        if not 0 <= k < len(self):
            raise IndexError(f"step {index} of a schedule of {len(self)} steps")
        step = self._steps[k]
        if step is None:
            step = self._steps[k] = self._build(k)
        return step

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str | bytes):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]  # as a list's

    def __reduce__(self) -> tuple[type[list], tuple[list[Step]]]:
        """Pickled and copied as the list of its steps, every one built."""
        return (list, (list(self),))

    def __repr__(self) -> str:
        return f"LazySteps({list(self)!r})"


@dataclass
class Schedule:
    """A complete schedule for one AlltoAllv call."""

    ranks: int
    steps: list[Step] | LazySteps
    fingerprint: str
    lambda_s: float
    kind: str = "general"  # "channel" for sequences of channel activations
    meta: dict[str, Any] = field(default_factory=dict)

    def dependencies(self, s: int) -> tuple[int, ...]:
        deps = self.steps[s].deps
        if deps is None:
            return (s - 1,) if s > 0 else ()
        return deps

    def overhead(self, s: int) -> float:
        over = self.steps[s].overhead
        return self.lambda_s if over is None else over

    @property
    def num_transfers(self) -> int:
        return sum(len(st.transfers) for st in self.steps)

    def served(self) -> np.ndarray:
        """The demand this schedule serves: bytes of each D[i][j] that leave i."""
        out = np.zeros((self.ranks, self.ranks), dtype=np.int64)
        for st in self.steps:
            for t in st.transfers:
                if t.src == t.carries[0]:
                    out[t.carries] += t.nbytes
        return out

    def modeled_time(self, alpha_s: float = 0.0) -> float:
        """Σ_k (λ + α + max_i x_ki / bw(p_ki)) for sequential steps (paper Eq. 2)."""
        total = 0.0
        for s, st in enumerate(self.steps):
            slowest = max((t.nbytes / (t.rate * 1e9) for t in st.transfers), default=0.0)
            total += self.overhead(s) + (alpha_s if st.transfers else 0.0) + slowest
        return total

    # ----- serialisation ----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": VERSION,
            "ranks": self.ranks,
            "fingerprint": self.fingerprint,
            "lambda_s": self.lambda_s,
            "kind": self.kind,
            "meta": self.meta,
            "steps": [
                {
                    "deps": None if st.deps is None else list(st.deps),
                    "overhead": st.overhead,
                    "transfers": [
                        [
                            t.src,
                            t.dst,
                            t.nbytes,
                            t.carries[0],
                            t.carries[1],
                            t.rate,
                            t.cls,
                            list(t.path),
                            [list(a) for a in t.after],
                            t.staged,
                            t.pull,
                        ]
                        for t in st.transfers
                    ],
                }
                for st in self.steps
            ],
        }

    @classmethod
    def from_dict(cls, data: Any, source: str = "schedule") -> Schedule:
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ScheduleError(f"{source}: not a {FORMAT} document")
        version = data.get("version")
        if version not in _WIDTH:
            raise ScheduleError(f"{source}: unsupported version {version!r}")
        width = _WIDTH[version]
        steps = []
        try:
            for s, raw in enumerate(data["steps"]):
                transfers = []
                for k, row in enumerate(raw["transfers"]):
                    where = f"{source}: steps[{s}].transfers[{k}]"
                    if len(row) != width:
                        raise ScheduleError(f"{where}: expected {width} fields, got {len(row)}")
                    src, dst, nbytes, ci, cj, rate, kind, path = row[:8]
                    defaults = ([], False, False)  # what versions before each field meant
                    after, staged, pull = (*row[8:], *defaults[len(row) - 8 :])
                    if not all(isinstance(v, int) for v in (src, dst, nbytes, ci, cj)):
                        raise ScheduleError(f"{where}: ranks and bytes must be integers")
                    if not isinstance(staged, bool) or not isinstance(pull, bool):
                        raise ScheduleError(f"{where}: staged and pull must be true or false")
                    if not all(len(ref) == 2 and all(type(v) is int for v in ref) for ref in after):
                        raise ScheduleError(f"{where}: after must list [step, index] integer pairs")
                    refs = tuple((a, b) for a, b in after)
                    transfers.append(
                        Transfer(
                            src,
                            dst,
                            tuple(path),
                            nbytes,
                            (ci, cj),
                            float(rate),
                            kind,
                            staged,
                            refs,
                            pull,
                        )
                    )
                deps = raw.get("deps")
                overhead = raw.get("overhead")
                if overhead is not None and not (
                    isinstance(overhead, int | float) and not isinstance(overhead, bool)
                ):
                    raise ScheduleError(f"{source}: steps[{s}].overhead must be a number or null")
                steps.append(
                    Step(tuple(transfers), None if deps is None else tuple(deps), overhead)
                )
            return cls(
                int(data["ranks"]),
                steps,
                str(data["fingerprint"]),
                float(data["lambda_s"]),
                str(data.get("kind", "general")),
                dict(data.get("meta", {})),
            )
        except (KeyError, TypeError, ValueError) as err:
            raise ScheduleError(f"{source}: malformed schedule: {err!r}") from None

    def save(self, path: str | FsPath) -> None:
        FsPath(path).write_text(json.dumps(self.to_dict(), separators=(",", ":")))

    @classmethod
    def load(cls, path: str | FsPath) -> Schedule:
        path = FsPath(path)
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as err:
            raise ScheduleError(f"{path}: invalid JSON at line {err.lineno}: {err.msg}") from None
        return cls.from_dict(data, str(path))


def reversed_schedule(schedule: Schedule, graph) -> Schedule:
    """The schedule's transfers reversed, as the op runs a cached plan for the transposed demand
    (ffi/layout.cc ``transposed_plan``): j → i along the reversed path of i → j, the same steps,
    bytes, rates and dependencies. Direct transfers only (the op's plans never relay)."""
    steps = []
    for step in schedule.steps:
        moved = []
        for t in step.transfers:
            if t.carries != (t.src, t.dst):
                raise VarioPathError("a relayed transfer cannot be reversed in place")
            path = tuple(
                graph.link(graph.links[k].dst, graph.links[k].src) for k in reversed(t.path)
            )
            moved.append(
                dataclasses.replace(t, src=t.dst, dst=t.src, path=path, carries=(t.dst, t.src))
            )
        steps.append(Step(tuple(moved), step.deps, step.overhead))
    return dataclasses.replace(schedule, steps=steps, meta={**schedule.meta, "reversed": True})


def signal_driven(schedule: Schedule) -> Schedule:
    """The same transfers, executed signal-driven (paper §5: no global barriers).

    Steps are taken in order and lose their dependencies and overhead; each transfer waits
    instead for its sender's sends of the last step it sent in, its receiver's receives of the
    last step it received in, the transfers of the last step that crossed each of its links and,
    at a relay, every earlier transfer that brought bytes of the same demand entry to the
    sender. For a schedule whose steps run one after another this keeps every order that matters
    for its bytes and drops only the barriers; and activations overlap only where they share no
    link, so a sequence of contention-free channels stays contention-free (paper §3: each
    resource used by one lane at a time), which the analytic predictor then prices exactly.
    Without the link waits, overlapping activations contended on shared links: on fig8's
    r5080-bf3 × 1 uniform 64 MiB under ``pcie`` 3.80 ms simulated for 2.52 ms predicted, against
    1.55 ms (exact) with them.
    """
    last_send: dict[int, list[tuple[int, int]]] = {}
    last_recv: dict[int, list[tuple[int, int]]] = {}
    last_link: dict[int, list[tuple[int, int]]] = {}
    arrivals: dict[tuple[int, int, int], list[tuple[int, int]]] = {}  # (i, j, node) -> transfers
    steps = []
    for s, st in enumerate(schedule.steps):
        transfers = []
        for t in st.transfers:
            after = {*last_send.get(t.src, ()), *last_recv.get(t.dst, ()), *t.after}
            for lid in t.path:
                after.update(last_link.get(lid, ()))
            if t.src != t.carries[0]:
                after.update(arrivals.get((*t.carries, t.src), ()))
            transfers.append(dataclasses.replace(t, after=tuple(sorted(after))))
        sends: dict[int, list[tuple[int, int]]] = {}
        recvs: dict[int, list[tuple[int, int]]] = {}
        links: dict[int, list[tuple[int, int]]] = {}
        for k, t in enumerate(st.transfers):
            sends.setdefault(t.src, []).append((s, k))
            recvs.setdefault(t.dst, []).append((s, k))
            for lid in t.path:
                links.setdefault(lid, []).append((s, k))
            arrivals.setdefault((*t.carries, t.dst), []).append((s, k))
        last_send.update(sends)
        last_recv.update(recvs)
        last_link.update(links)
        steps.append(Step(tuple(transfers), deps=(), overhead=0.0))
    meta = {**schedule.meta, "execution": "signal"}
    return Schedule(
        schedule.ranks, steps, schedule.fingerprint, schedule.lambda_s, schedule.kind, meta
    )


# ----- validation ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Validation:
    ok: bool
    errors: tuple[str, ...]

    def raise_if_invalid(self) -> None:
        if not self.ok:
            more = f" (and {len(self.errors) - 5} more)" if len(self.errors) > 5 else ""
            raise ScheduleError("invalid schedule: " + "; ".join(self.errors[:5]) + more)


def validate(
    schedule: Schedule, demand: np.ndarray, topo: Topology, max_errors: int = 20
) -> Validation:
    """Prove a schedule serves ``demand`` on ``topo``.

    Checks: every transfer's path is a connected route from its source GPU to its destination
    GPU with a rate no higher than its slowest link; dependencies point to earlier steps; every
    byte of every D[i][j] leaves i, ends at j exactly once, and a relay only forwards bytes that
    arrived in steps that finished before (conservatively, also net of forwards by steps that may
    run concurrently). For ``kind == "channel"`` also: every transfer is direct, every step is a
    partial permutation, and no two paths in a step share a resource in U (paper Eq. 1).
    """
    errors: list[str] = []

    def err(msg: str) -> bool:
        errors.append(msg)
        return len(errors) >= max_errors

    n = schedule.ranks
    demand = np.asarray(demand)
    if demand.shape != (n, n):
        return Validation(False, (f"demand is {demand.shape}, schedule has {n} ranks",))
    if n != topo.num_ranks:
        return Validation(False, (f"schedule has {n} ranks, topology {topo.num_ranks}",))
    if schedule.fingerprint != topo.fingerprint:
        return Validation(
            False, (f"schedule is for topology {schedule.fingerprint}, not {topo.fingerprint}",)
        )
    g = topo.graph
    gpu_vertex = g.gpus
    endpoint = {
        lid
        for lid, lk in enumerate(g.links)
        if lk.kind == "pcie" and (g.kinds[lk.src] == "gpu" or g.kinds[lk.dst] == "gpu")
    }
    n_links = len(g.links)

    # per commodity and node: the (step, index, bytes) of every transfer leaving / reaching it
    sent: dict[tuple[int, int], dict[int, list[tuple[int, int, int]]]] = {}
    received: dict[tuple[int, int], dict[int, list[tuple[int, int, int]]]] = {}
    for s, st in enumerate(schedule.steps):
        for d in schedule.dependencies(s):
            if not 0 <= d < s and err(f"step {s}: dependency {d} is not an earlier step"):
                return Validation(False, tuple(errors))
        negative = st.overhead is not None and not st.overhead >= 0
        if negative and err(f"step {s}: overhead must be >= 0, got {st.overhead}"):
            return Validation(False, tuple(errors))
        senders: set[int] = set()
        receivers: set[int] = set()
        used: dict[int, int] = {}
        for k, t in enumerate(st.transfers):
            where = f"step {s} transfer {k} ({t.src}->{t.dst}, carries {t.carries})"
            i, j = t.carries
            if not (0 <= t.src < n and 0 <= t.dst < n and 0 <= i < n and 0 <= j < n):
                if err(f"{where}: rank out of range"):
                    break
                continue
            if t.nbytes <= 0 and err(f"{where}: bytes must be > 0, got {t.nbytes}"):
                break
            if t.src == t.dst and err(f"{where}: a transfer to itself"):
                break
            if (t.src == j or t.dst == i) and err(
                f"{where}: bytes of D[{i}][{j}] leave {j} or return to {i}"
            ):
                break
            # the path: connected, from src GPU to dst GPU, rate within capacity
            path = t.path
            if not path or any(not 0 <= lid < n_links for lid in path):
                if err(f"{where}: empty path or unknown link id"):
                    break
                continue
            links = [g.links[lid] for lid in path]
            connected = links[0].src == gpu_vertex[t.src] and links[-1].dst == gpu_vertex[t.dst]
            connected = connected and all(a.dst == b.src for a, b in pairwise(links))
            if not connected and err(
                f"{where}: path is not a route from GPU {t.src} to GPU {t.dst}"
            ):
                break
            cap = min(lk.gbs for lk in links)
            if not 0 < t.rate <= cap * (1 + 1e-9) and err(
                f"{where}: rate {t.rate} GB/s exceeds the path's {cap} GB/s"
            ):
                break
            bad = [
                (a, b)
                for a, b in t.after
                if not (a < s or (a == s and b < k))
                or not 0 <= a < len(schedule.steps)
                or not 0 <= b < len(schedule.steps[a].transfers)
            ]
            if bad and err(f"{where}: waits for {bad[0]}, which is not an earlier transfer"):
                break
            sent.setdefault(t.carries, {}).setdefault(t.src, []).append((s, k, t.nbytes))
            received.setdefault(t.carries, {}).setdefault(t.dst, []).append((s, k, t.nbytes))
            if schedule.kind == "channel":
                if (t.src, t.dst) != t.carries and err(f"{where}: a channel lane must be direct"):
                    break
                if t.src in senders and err(
                    f"step {s}: rank {t.src} sends twice (not a permutation)"
                ):
                    break
                if t.dst in receivers and err(
                    f"step {s}: rank {t.dst} receives twice (not a permutation)"
                ):
                    break
                senders.add(t.src)
                receivers.add(t.dst)
                for lid in path:
                    if lid in endpoint:
                        continue
                    if lid in used and err(
                        f"step {s}: transfers {used[lid]} and {k} share resource {g.link_name(lid)}"
                    ):
                        break
                    used[lid] = k
        if len(errors) >= max_errors:
            return Validation(False, tuple(errors))

    # exact delivery and causality per commodity
    order = _Precedence(schedule)
    served = np.zeros_like(demand, dtype=np.int64)
    for (i, j), by_node in sent.items():
        served[i, j] = sum(x for *_, x in by_node.get(i, []))
    for i in range(n):
        for j in range(n):
            want, got = int(demand[i, j]), int(served[i, j])
            if i == j:
                if want:
                    err(f"D[{i}][{i}] = {want}: self traffic stays local and is not scheduled")
                continue
            arrived = sum(x for *_, x in received.get((i, j), {}).get(j, []))
            if got != want and err(f"D[{i}][{j}] = {want} bytes but {got} leave rank {i}"):
                break
            if arrived != want and err(
                f"D[{i}][{j}] = {want} bytes but {arrived} arrive at rank {j}"
            ):
                break
    for c, by_node in sent.items():
        for node, outs in by_node.items():
            if node == c[0]:
                continue
            ins = received.get(c, {}).get(node, [])
            got, fwd = sum(x for *_, x in ins), sum(x for *_, x in outs)
            if got != fwd:
                err(f"relay {node} of D{list(c)} receives {got} bytes but forwards {fwd}")
                continue
            for s, k, _ in outs:
                available = sum(x for a, b, x in ins if order.precedes((a, b), (s, k)))
                spent = sum(
                    x for a, b, x in outs if (a, b) == (s, k) or not order.precedes((s, k), (a, b))
                )
                if spent > available:
                    err(
                        f"relay {node} of D{list(c)} forwards {spent} bytes by step {s} "
                        f"transfer {k} but only {available} have surely arrived"
                    )
                    break
    for c, by_node in received.items():
        for node in by_node:
            if node != c[1] and node not in sent.get(c, {}):
                err(f"bytes of D{list(c)} end at rank {node}, not {c[1]}")
    return Validation(not errors, tuple(errors))


class _Precedence:
    """Which relay transfers surely ended before another transfer starts (conservatively).

    Transfer u precedes t when u's step is an ancestor of a step known to have started before t,
    or u is reached from t through ``after`` references: t's own step, and the step of every
    transfer reached, have started, so their ancestor steps have finished. Computed once, in
    transfer order, as bitmasks: per transfer, the steps surely finished and the *relay
    transfers* (those a relay receives or forwards, the only ones asked about) surely ended.
    """

    def __init__(self, schedule: Schedule) -> None:
        ancestors = _ancestor_masks(schedule)
        relay_bit: dict[tuple[int, int], int] = {}
        for s, st in enumerate(schedule.steps):
            for k, t in enumerate(st.transfers):
                if t.src != t.carries[0] or t.dst != t.carries[1]:
                    relay_bit[(s, k)] = len(relay_bit)
        self.relay_bit = relay_bit
        self.finished: dict[tuple[int, int], int] = {}  # steps surely finished before it starts
        self.ended: dict[tuple[int, int], int] = {}  # relay transfers surely ended before it
        if not relay_bit:  # no relays: nothing will be asked
            return
        for s, st in enumerate(schedule.steps):
            for k, t in enumerate(st.transfers):
                finished, ended = ancestors[s], 0
                for u in t.after:
                    if u not in self.finished:  # not an earlier transfer: reported elsewhere
                        continue
                    finished |= self.finished[u]
                    ended |= self.ended[u]
                    if u in relay_bit:
                        ended |= 1 << relay_bit[u]
                self.finished[(s, k)], self.ended[(s, k)] = finished, ended

    def precedes(self, u: tuple[int, int], t: tuple[int, int]) -> bool:
        """Whether relay transfer ``u`` surely ended before transfer ``t`` starts."""
        if self.finished[t] >> u[0] & 1:
            return True
        return bool(self.ended[t] >> self.relay_bit[u] & 1)


def _ancestor_masks(schedule: Schedule) -> list[int]:
    """For each step, a bitmask of the steps that surely finished before it starts."""
    masks: list[int] = []
    for s in range(len(schedule.steps)):
        m = 0
        for d in schedule.dependencies(s):
            if 0 <= d < s:
                m |= masks[d] | (1 << d)
        masks.append(m)
    return masks
