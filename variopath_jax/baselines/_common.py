"""Building blocks shared by the peer schedulers (FAST, DeepEP, RailWave, MSCCL).

- :func:`demand_matrix`: the request's demand as int64 with the diagonal dropped (self traffic is
  a local copy and is never scheduled, paper §2.3);
- :class:`Router`: NCCL's fixed route per rank pair (:func:`~variopath_jax.baselines.nccl.nccl_route`
  with :func:`~variopath_jax.baselines.nccl.rail_nics`), or a route through the rail NICs for
  every pair, cached per (rank group, rank group, NIC, NIC) so that 256-rank schedules build fast;
- :class:`StepGraph`: steps with explicit dependencies, empty steps dropped at the end (their
  dependencies pass through to their dependents);
- :func:`split_even`: integer bytes split into near-equal parts.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from variopath_jax.baselines.nccl import nccl_route, rail_nics
from variopath_jax.errors import VarioPathError
from variopath_jax.schedule import Schedule, Step, Transfer
from variopath_jax.schedulers import PlanRequest
from variopath_jax.topology import PathModel, Route
from variopath_jax.topology.model import RELATION_ORDER

_GDR_LEVEL = RELATION_ORDER.index("PXB")  # NCCL_NET_GDR_LEVEL's default, as nccl.py


def demand_matrix(req: PlanRequest) -> np.ndarray:
    """The demand as an int64 copy with a zero diagonal."""
    demand = np.array(req.demand, dtype=np.int64)
    np.fill_diagonal(demand, 0)
    return demand


def split_even(nbytes: int, parts: int) -> list[int]:
    """``nbytes`` split into ``parts`` integers differing by at most one, larger ones first."""
    base, rest = divmod(int(nbytes), parts)
    return [base + (k < rest) for k in range(parts)]


class Router:
    """Transfers along fixed routes, cached per (group, group, NIC, NIC).

    Parameters
    ----------
    model : PathModel
    """

    def __init__(self, model: PathModel) -> None:
        self.model = model
        self.topology = model.topology
        self.nics = rail_nics(model)
        self.group_of = [int(g) for g in model.group_of]
        self._ends = [model.endpoint_links(r) for r in range(self.topology.num_ranks)]
        self._cache: dict[tuple[str, int, int, int, int], Route] = {}

    def _key(self, kind: str, i: int, j: int) -> tuple[str, int, int, int, int]:
        return (kind, self.group_of[i], self.group_of[j], self.nics[i], self.nics[j])

    def nccl(self, i: int, j: int) -> Route:
        """NCCL's route from rank i to rank j (see ``nccl.py``)."""
        key = self._key("nccl", i, j)
        if key not in self._cache:
            self._cache[key] = nccl_route(self.model, i, j, self.nics)
        return self._cache[key]

    def rdma(self, i: int, j: int) -> Route:
        """From rank i through its rail NIC, the fabric (a loopback when both ranks share the NIC)
        and rank j's rail NIC to rank j, for ranks on one node too. Each side goes through host
        memory when GPUDirect RDMA is off or the GPU-NIC class is beyond PXB, as NCCL decides."""
        key = self._key("rdma", i, j)
        if key not in self._cache:
            topo = self.topology
            if not topo.nics_per_node:
                raise VarioPathError(f"topology {topo.name!r} has no NICs to send through")
            node, per, per_nic = topo.node, topo.gpus_per_node, topo.nics_per_node
            s, r = self.nics[i], self.nics[j]

            def staged(rank: int, nic: int) -> bool:
                rel = node.relation(node.gpus[rank % per].name, node.nics[nic % per_nic].name)
                return not topo.gdr or RELATION_ORDER.index(rel) > _GDR_LEVEL

            self._cache[key] = self.model.nic_route(
                self.group_of[i], self.group_of[j], s, r, (staged(i, s), staged(j, r))
            )
        return self._cache[key]

    def transfer(
        self, i: int, j: int, route: Route, nbytes: int, carries: tuple[int, int]
    ) -> Transfer:
        """``nbytes`` of demand entry ``carries`` from rank i to rank j along ``route``."""
        links = route.links
        if route.via_endpoints:
            links = (self._ends[i][0], *links, self._ends[j][1])
        return Transfer(i, j, links, int(nbytes), carries, route.rate, route.cls, route.staged)


class StepGraph:
    """Steps with explicit dependencies; empty steps are dropped by :meth:`steps`."""

    def __init__(self) -> None:
        self._transfers: list[list[Transfer]] = []
        self._deps: list[tuple[int, ...]] = []

    def add(self, deps: Iterable[int | None] = ()) -> int:
        """A new step depending on ``deps`` (``None`` entries are ignored); returns its id."""
        self._transfers.append([])
        self._deps.append(tuple(sorted({d for d in deps if d is not None})))
        return len(self._deps) - 1

    def put(self, step: int, transfer: Transfer) -> None:
        self._transfers[step].append(transfer)

    def steps(self) -> list[Step]:
        """The non-empty steps in order; a dependency on an empty step becomes a dependency on
        whatever that step depended on."""
        index: dict[int, int] = {}
        through: list[frozenset[int]] = []  # what depending on step s means, in new ids
        out: list[Step] = []
        for s, (transfers, deps) in enumerate(zip(self._transfers, self._deps, strict=True)):
            resolved = frozenset().union(*(through[d] for d in deps)) if deps else frozenset()
            if transfers:
                index[s] = len(out)
                out.append(Step(tuple(transfers), tuple(sorted(resolved))))
                through.append(frozenset({index[s]}))
            else:
                through.append(resolved)
        return out


def make_schedule(req: PlanRequest, steps: list[Step], meta: dict) -> Schedule:
    """A general (non-channel) schedule of ``steps`` for the request's topology."""
    topo = req.model.topology
    return Schedule(topo.num_ranks, steps, topo.fingerprint, req.lambda_s, "general", meta)
