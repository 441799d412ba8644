"""A swap search over the channels of a schedule: the channel model's local search (issue 31).

A channel schedule with its activations' durations set by the time-sharing LP over its own
channels (:func:`~solver.milp.polish`) costs K·c + LP(S), S its set of K channels and
c = λ + α_min; finding S is the hard part. From a schedule's channels the search moves to the
best of its neighbours while one is cheaper (steepest descent; Aarts & Lenstra, "Local Search
in Combinatorial Optimization", 1997, ch. 1):

- *drop* a channel of S;
- *swap* a channel a of S for a channel b of the catalog, b among the ``TOP`` that the duals π
  of LP(S − a) price highest (Σ_p π_p·bw_bp: what an hour of b is worth to S − a; pairs that
  S − a leaves uncovered carry a penalty cost, so their duals lead);
- *add* a channel b, among the ``TOP`` that the duals of LP(S) price highest.

Every neighbour is valued exactly by its LP (HiGHS through :func:`scipy.optimize.linprog`); the
search stops at a local optimum or after ``max_lps`` LPs, so it is deterministic and its work
does not depend on the machine's load. It bounds nothing. The catalog is every maximal partial
channel (:func:`~solver.channels.enumerate_channels`: one node of at most 8 GPUs), and lanes
are charged α_min as in the configuration LP (the schedule's simulated time adds each lane's
δ = α − α_min).

In the gap study it turns a schedule into a warm start the K-slot model's CP-SAT improves
further (64 MiB seed 1: the K-slot schedule 2,147.5 µs, swapped 2,144.0 µs with 9 channels,
then CP-SAT on K = 9 hinted with it 2,084.2 µs in 15 s with two workers, an ad-hoc script;
docs/solver.md).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from scipy.optimize import linprog

from variopath_jax.schedule import Schedule
from variopath_jax.sim.network import NetworkModel
from variopath_jax.solver.channels import Channel, candidate_lanes, enumerate_channels
from variopath_jax.solver.milp import channels_of, polish
from variopath_jax.topology import PathModel

TOP = 8  # channels tried per swap or add, in the order the duals price them
UNCOVERED_US_PER_KB = 1e4  # an uncovered pair's cost in the LP: far above any channel's time


class SwapSearch:
    """The catalog and one demand's pairs, ready to improve that demand's channel schedules."""

    def __init__(self, demand: np.ndarray, model: PathModel, network: NetworkModel) -> None:
        off = np.asarray(demand, dtype=np.int64).copy()
        np.fill_diagonal(off, 0)
        n = len(off)
        self.demand = off
        self.model = model
        self.lambda_s = network.barrier_s
        self.pairs = [(i, j) for i in range(n) for j in range(n) if off[i, j] > 0]
        self.index = {p: k for k, p in enumerate(self.pairs)}
        self.volume_kb = np.array([off[p] / 1e3 for p in self.pairs])
        lanes = candidate_lanes(model, off, network)
        self.cost_us = (
            network.barrier_s + min((lane.alpha_s for lane in lanes), default=0.0)
        ) * 1e6
        self.catalog = enumerate_channels(model)
        rows, cols, rates = [], [], []
        for a, ch in enumerate(self.catalog):
            for p, rate in zip(ch.pairs, ch.rates, strict=True):
                if p in self.index:
                    rows.append(a)
                    cols.append(self.index[p])
                    rates.append(rate)
        shape = (len(self.catalog), len(self.pairs))
        self.rates = sp.csr_matrix((rates, (rows, cols)), shape=shape)  # GB/s = kB/µs

    @staticmethod
    def applies(model: PathModel) -> bool:
        """Whether the catalog can be enumerated (one node of at most 8 GPUs)."""
        return model.topology.nodes == 1 and model.topology.num_ranks <= 8

    def _vector(self, ch: Channel) -> np.ndarray:
        out = np.zeros(len(self.pairs))
        for p, rate in zip(ch.pairs, ch.rates, strict=True):
            if p in self.index:
                out[self.index[p]] = rate
        return out

    def _lp(self, vectors: list[np.ndarray]) -> tuple[float, np.ndarray, np.ndarray]:
        """LP(S) in µs (inf where S leaves a pair uncovered), each channel's duration and the
        pairs' duals (µs per kB)."""
        k, m = len(vectors), len(self.pairs)
        covers = np.array(vectors).reshape(k, m).T
        result = linprog(
            np.r_[np.ones(k), np.full(m, UNCOVERED_US_PER_KB)],
            A_ub=-np.hstack([covers, np.eye(m)]),
            b_ub=-self.volume_kb,
            bounds=(0, None),
            method="highs",
        )
        if not result.success:  # HiGHS gave up (numerics): a neighbour never taken
            return np.inf, np.zeros(k), np.zeros(m)
        t, short = result.x[:k], result.x[k:]
        value = float(t.sum()) if short.max(initial=0.0) <= 1e-6 else np.inf  # kB
        return value, t, -result.ineqlin.marginals

    def _cost(self, vectors: list[np.ndarray]) -> tuple[float, np.ndarray, np.ndarray]:
        """K·c + LP(S), K the channels the LP runs, their durations and the pairs' duals."""
        value, t, duals = self._lp(vectors)
        return value + self.cost_us * int((t > 1e-9).sum()), t, duals

    def _priced(self, duals: np.ndarray, members: list[np.ndarray]) -> list[int]:
        """The ``TOP`` catalog channels the duals price highest, none already in S."""
        worth = self.rates @ duals
        out = []
        for b in np.argsort(-worth, kind="stable"):
            row = self.rates[b].toarray()[0]
            if not any(np.array_equal(row, v) for v in members):
                out.append(int(b))
            if len(out) == TOP:
                break
        return out

    def improve(
        self, schedule: Schedule, slots: int | None = None, max_lps: int = 1500
    ) -> Schedule | None:
        """The schedule of the local optimum reached from ``schedule``'s channels (see module).
        Without ``slots``, None where it is no cheaper than ``schedule``'s own channels. With
        ``slots``, first *reduce* to at most ``slots`` channels (each round the cheapest drop
        that keeps every pair covered, else two channels for one the duals of the rest price
        highest, the first of the two among the three shortest), then search without growing
        past it: the schedule returned fits ``slots`` activations, cheaper or not (a warm start
        for the K-slot model); None where no reduction keeps every pair covered (or the work
        limit ``max_lps`` runs out first)."""
        if not self.pairs:
            return None
        channels = channels_of(schedule)
        members = [self._vector(ch) for ch in channels]
        cost, t, duals = self._cost(members)
        start_cost, lps = cost, 1
        while lps < max_lps:
            keep = t > 1e-9
            members = [v for v, k in zip(members, keep, strict=True) if k]
            channels = [ch for ch, k in zip(channels, keep, strict=True) if k]
            t = t[keep]
            if slots is not None and len(members) > slots:
                move, used = self._reduction(members, t)
            else:
                move, used = self._best_move(
                    members, duals, cost, grow=slots is None or len(members) < slots
                )
            lps += used
            if move is None:
                break
            removed, b = move
            members = [v for a, v in enumerate(members) if a not in removed]
            channels = [ch for a, ch in enumerate(channels) if a not in removed]
            if b is not None:
                members.append(self.rates[b].toarray()[0])
                channels.append(self.catalog[b])
            cost, t, duals = self._cost(members)
            lps += 1
        fits = slots is None or int((t > 1e-9).sum()) <= slots
        if not np.isfinite(cost) or not fits or (slots is None and cost >= start_cost - 1e-6):
            return None
        channels = [ch for ch, time_us in zip(channels, t, strict=True) if time_us > 1e-9]
        found = polish(channels, self.demand, self.model.topology.fingerprint, self.lambda_s)
        if found is not None:
            found.meta["scheduler"] = "swap"
        return found

    def _best_move(
        self, members: list[np.ndarray], duals: np.ndarray, cost: float, grow: bool
    ) -> tuple[tuple[tuple[int, ...], int | None] | None, int]:
        """The cheapest neighbour below ``cost`` (drop, swap, and add where ``grow``) as
        (channels removed, catalog channel added), None where none is cheaper; LPs solved."""
        best, move, lps = cost - 1e-6, None, 0
        if grow:
            for b in self._priced(duals, members):
                value, *_ = self._cost([*members, self.rates[b].toarray()[0]])
                lps += 1
                if value < best:
                    best, move = value, ((), b)
        for a in range(len(members)):
            rest = members[:a] + members[a + 1 :]
            value, _, rest_duals = self._cost(rest)
            lps += 1
            if value < best:
                best, move = value, ((a,), None)
            for b in self._priced(rest_duals, rest):
                value, *_ = self._cost([*rest, self.rates[b].toarray()[0]])
                lps += 1
                if value < best:
                    best, move = value, ((a,), b)
        return move, lps

    def _reduction(
        self, members: list[np.ndarray], t: np.ndarray
    ) -> tuple[tuple[tuple[int, ...], int | None] | None, int]:
        """The cheapest way to one channel fewer (see :meth:`improve`): the cheapest drop that
        keeps every pair covered, else two channels for one; None where every way leaves a pair
        uncovered; LPs solved."""
        best, move, lps = np.inf, None, 0
        for a in range(len(members)):
            value, *_ = self._cost(members[:a] + members[a + 1 :])
            lps += 1
            if value < best:
                best, move = value, ((a,), None)
        if move is not None:
            return move, lps
        for a in np.argsort(t, kind="stable")[:3]:
            for a2 in range(len(members)):
                if a2 == a:
                    continue
                rest = [v for m, v in enumerate(members) if m not in (a, a2)]
                _, _, duals = self._cost(rest)
                lps += 1
                for b in self._priced(duals, rest)[:3]:
                    value, *_ = self._cost([*rest, self.rates[b].toarray()[0]])
                    lps += 1
                    if value < best:
                        best, move = value, ((int(a), a2), b)
        return move, lps
