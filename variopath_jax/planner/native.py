"""The C++ planner core (ffi/planner.cc) behind the same interface as the Python reference.

The one typed boundary into C++: :func:`native_deployment` and :func:`native_params` fill the
nanobind-bound ``Deployment`` and ``PlanParams`` structs; ``NativePlanner`` and the JAX op's
configuration (``jax_ops/config.py``) both cross with them and nothing else.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import time
from collections import OrderedDict
from dataclasses import fields

import numpy as np

from variopath_jax import workloads
from variopath_jax.catalog import Catalog, store
from variopath_jax.errors import TopologyError
from variopath_jax.planner.reference import LaneKind, PlannerParams, PlanStats
from variopath_jax.schedule import LazySteps, Schedule, Step, Transfer
from variopath_jax.sim.network import NetworkModel, model_names
from variopath_jax.topology import PathModel, Topology
from variopath_jax.topology.paths import Route, staged_class
from variopath_jax.workloads import validate_demand


def _native():
    from variopath_jax import _native

    return _native


def native_params(params: PlannerParams):
    """``PlannerParams`` as the C++ core's ``PlanParams``, field for field."""
    nat = _native()
    out = nat.PlanParams()
    for f in fields(PlannerParams):
        value = getattr(params, f.name)
        if f.name == "k_target":
            value = value or 0
        elif f.name == "granularity":
            value = nat.Granularity.__members__[value.upper()]
        elif f.name == "leaving_price":
            value = nat.LeavingPrice.__members__[value.upper()]
        setattr(out, f.name, value)
    return out


def native_deployment(catalog: Catalog, model: PathModel):
    """What the C++ core needs to know about the deployment besides the catalog."""
    nat = _native()
    topo, g = model.topology, model.graph
    n = topo.num_ranks
    dep = nat.Deployment()
    dep.ranks = n
    dep.n_groups = len(model.groups)
    dep.group_size = catalog.group_size
    dep.group_ranks = [r for grp in model.groups for r in grp]
    dep.group_of = [int(x) for x in model.group_of]
    ups = [model.endpoint_links(i)[0] for i in range(n)]
    downs = [model.endpoint_links(i)[1] for i in range(n)]
    dep.endpoint_up, dep.endpoint_down = ups, downs
    dep.endpoint_up_gbs = [g.links[lid].gbs for lid in ups]
    dep.endpoint_down_gbs = [g.links[lid].gbs for lid in downs]
    layout = nat.LinkLayout()
    layout.nodes = g.layout.nodes
    layout.links_per_node = g.layout.links_per_node
    layout.net_links_per_node = g.layout.net_links_per_node
    dep.layout = layout
    near_ptr, near_links, near_rate, near_via = [0], [], [], []
    for a in range(dep.n_groups):
        for d in range(dep.n_groups):
            r = model.nearest(a, d) if model.routes(a, d) else None
            if r is not None:
                near_links += list(r.links)
            near_rate.append(r.rate if r is not None else 0.0)
            near_via.append(1 if r is None or r.via_endpoints else 0)
            near_ptr.append(len(near_links))
    dep.near_ptr, dep.near_links, dep.near_rate, dep.near_via = (
        near_ptr,
        near_links,
        near_rate,
        near_via,
    )
    return dep


class NativePlanner:
    """Algorithm 2 in C++; the same schedule as ``ReferencePlanner`` for the same inputs."""

    def __init__(self, catalog: Catalog, model: PathModel, params: PlannerParams) -> None:
        catalog.check_topology(model.topology, model)
        self.catalog, self.model, self.params = catalog, model, params
        self._core = _native().Planner(
            store.dumps(catalog), catalog.fingerprint, native_deployment(catalog, model)
        )
        self._params = native_params(params)
        self._classes = [it.cls for it in catalog.instances.instances]

    def plan(self, demand: np.ndarray) -> Schedule:
        checked = validate_demand(demand, self.model.topology.num_ranks)
        start = time.perf_counter()  # the planner's own time: the core's call
        out = self._core.plan(checked, self._params)
        seconds = time.perf_counter() - start
        steps = []
        src, dst, nbytes, rate = out["src"], out["dst"], out["bytes"], out["rate"]
        kind, inst = out["lane_kind"], out["lane_inst"]
        link_ptr, links = out["link_ptr"], out["links"]
        group_of = self.model.group_of
        step_ptr = out["step_ptr"]
        for s in range(len(step_ptr) - 1):
            transfers = []
            for t in range(step_ptr[s], step_ptr[s + 1]):
                i, j = int(src[t]), int(dst[t])
                if kind[t] in (LaneKind.FLAT, LaneKind.INTRA):
                    cls = self._classes[inst[t]]
                elif kind[t] == LaneKind.NET:
                    cls = "NET"
                else:
                    cls = self.model.nearest(int(group_of[i]), int(group_of[j])).cls
                path = tuple(int(x) for x in links[link_ptr[t] : link_ptr[t + 1]])
                staged = staged_class(self.model.topology, cls)
                transfers.append(
                    Transfer(i, j, path, int(nbytes[t]), (i, j), float(rate[t]), cls, staged)
                )
            steps.append(Step(tuple(transfers)))
        self.stats = PlanStats(
            len(steps), seconds, out["tau_s"], out["k"], out["fallbacks"], out["candidates"]
        )
        meta = {
            "scheduler": "variopath",
            "tau_s": out["tau_s"],
            "k": out["k"],
            "activations": len(steps),
            "fallbacks": out["fallbacks"],
            "candidates": out["candidates"],
            "catalog": self.catalog.kind,
        }
        return Schedule(
            len(demand),
            steps,
            self.model.topology.fingerprint,
            self.params.lambda_s,
            "channel",
            meta,
        )


ROOT_CLASSES = ("PHB", "NODE", "SYS")  # peer-to-peer forwarded by a host bridge or root complex


def scored_cells(catalog: Catalog, topo: Topology) -> int:
    """The shape cells Algorithm 2 scores per activation (its planning estimate,
    ``ChoiceCore::algorithm2_work_s``): the catalog's shapes times their cells, once per node for
    a factored catalog (each node picks its pattern)."""
    shapes = np.shape(catalog.shapes)
    nodes = topo.nodes if catalog.kind == "factored" else 1
    return int(shapes[0] * shapes[1] * shapes[2] * nodes)


def native_choice_deployment(catalog: Catalog, model: PathModel) -> tuple[object, list[Route]]:
    """What the C++ choice (ffi/choice.h) needs of the deployment, and its route list: every
    group pair's candidate routes fastest first, then every pair's memory route; the links'
    capacities, contention classes and NIC flags; whether Algorithm 2's lanes are staged (as
    :class:`NativePlanner` derives them); whether the links are the same both ways
    (``Graph.symmetric``); where the posted-write trigger is watched (``sim.RootPorts``: each
    link's root complex and whether it is an uplink, the node's root complexes) and the
    topology's factor (else ``DEFAULT_TRIGGER_FACTOR``, as ``NetworkModel.trigger_factor_for``)."""
    from variopath_jax.sim.network import (
        DEFAULT_TRIGGER_FACTOR,
        RootPorts,
        link_classes,
        through_nic,
    )

    nat = _native()
    topo, g = model.topology, model.graph
    n, n_groups = topo.num_ranks, len(model.groups)
    dep = nat.ChoiceDeployment()
    dep.ranks, dep.n_groups = n, n_groups
    dep.group_of = [int(x) for x in model.group_of]
    dep.endpoint_up = [model.endpoint_links(i)[0] for i in range(n)]
    dep.endpoint_down = [model.endpoint_links(i)[1] for i in range(n)]
    routes: list[Route] = []
    route_ptr, memory = [0], [-1] * (n_groups * n_groups)
    bounced = []
    for a in range(n_groups):
        for d in range(n_groups):
            routes += sorted(model.routes(a, d), key=lambda r: -r.rate)
            route_ptr.append(len(routes))
            with contextlib.suppress(TopologyError):
                bounced.append((a * n_groups + d, model.memory_route(a, d)))
    for pair, r in bounced:
        memory[pair] = len(routes)
        routes.append(r)
    link_ptr, links = [0], []
    for r in routes:
        links.extend(r.links)
        link_ptr.append(len(links))
    dep.route_ptr, dep.memory_route = route_ptr, memory
    dep.route_rate = [r.rate for r in routes]
    dep.route_root = [1 if r.cls in ROOT_CLASSES else 0 for r in routes]
    dep.route_staged = [1 if r.staged else 0 for r in routes]
    dep.route_via = [1 if r.via_endpoints else 0 for r in routes]
    dep.route_link_ptr, dep.route_links = link_ptr, links
    dep.link_cap = [lk.gbs * 1e9 for lk in g.links]
    dep.link_class = [int(c) for c in link_classes(topo)]
    dep.link_nic = [1 if x else 0 for x in through_nic(topo)]
    dep.symmetric = 1 if g.symmetric else 0
    ports = RootPorts(topo)
    if ports.complexes > 64:  # ffi/choice.h kMaxRootComplexes: a link's targets are a bitmask
        raise TopologyError(f"{ports.complexes} root complexes a node; the choice handles 64")
    dep.link_root_complex = [int(c) for c in ports.complex]
    dep.link_uplink = [1 if u >= 0 else 0 for u in ports.uplink]
    dep.root_complexes = max(ports.complexes, 1)
    dep.trigger_factor = float(
        DEFAULT_TRIGGER_FACTOR if topo.trigger_factor is None else topo.trigger_factor
    )
    dep.algorithm2_cells = scored_cells(catalog, topo)
    dep.inst_staged = [1 if staged_class(topo, it.cls) else 0 for it in catalog.instances.instances]
    dep.net_staged = 1 if staged_class(topo, "NET") else 0
    dep.near_staged = [
        1 if model.routes(a, d) and staged_class(topo, model.nearest(a, d).cls) else 0
        for a in range(n_groups)
        for d in range(n_groups)
    ]
    return dep, routes


def native_network(network: NetworkModel):
    """A ``NetworkModel`` as the C++ choice's ``NetParams``, field for field."""
    from variopath_jax.sim.network import LINK_CLASSES

    out = _native().NetParams()
    out.name = network.name
    for key in ("barrier_s", "issue_s", "latency_pcie_s", "latency_net_s", "signal_s"):
        setattr(out, key, float(getattr(network, key)))
    out.serial_issue = bool(network.serial_issue)
    out.beta = [float(network.contention[c]["beta"]) for c in LINK_CLASSES]
    out.floor = [float(network.contention[c]["floor"]) for c in LINK_CLASSES]
    out.paced_lossless = [1 if network.paced_lossless(c) else 0 for c in LINK_CLASSES]
    out.trigger = bool(network.trigger)
    # 0: the deployment's factor (ChoiceDeployment.trigger_factor)
    out.trigger_factor = float(network.trigger_factor or 0.0)
    return out


ALGORITHM2_PLANS = ("barrier", "signal")


def screen_demands(ranks: int) -> list[np.ndarray]:
    """The demands ``NativeChooser.algorithm2_pays`` tries: MoE dispatch at 8, 128 and 1024
    tokens per rank and Zipf (s = 0.6) at 64 KiB, 4 MiB and 256 MiB per rank, seed 0."""
    return [workloads.moe(ranks, m, seed=0) for m in (8, 128, 1024)] + [
        workloads.zipf(ranks, 0.6, b, seed=0) for b in (64 << 10, 4 << 20, 256 << 20)
    ]


def _params_key(nat) -> tuple:
    """A network model's parameters as the C++ choice reads them (``native_network``'s
    ``NetParams``), hashable."""
    return (
        nat.name,
        nat.barrier_s,
        nat.issue_s,
        nat.latency_pcie_s,
        nat.latency_net_s,
        nat.signal_s,
        nat.serial_issue,
        tuple(nat.beta),
        tuple(nat.floor),
        tuple(nat.paced_lossless),
        nat.trigger,
        nat.trigger_factor,
    )


_CONVERTED: OrderedDict[tuple[int, ...], tuple] = OrderedDict()
# the NetParams it holds are freed before nanobind's exit check (else: a leak report at exit)
atexit.register(_CONVERTED.clear)


def converted_networks(networks: tuple[NetworkModel, ...]) -> tuple[list, tuple]:
    """``networks`` as the C++ choice's ``NetParams`` (``native_network``) and as a hashable key
    (``_params_key``), converted once per tuple of model objects (the 16 used last; each holds
    its models, so an id is not reused while cached): a ``NetworkModel`` is immutable (frozen,
    its contention table read-only), so a call converts the models it was given last time
    neither for the screen's key nor for the core."""
    ids = tuple(id(n) for n in networks)
    hit = _CONVERTED.pop(ids, None)  # taken out and put back last: no step can miss its key
    if hit is None or any(a is not b for a, b in zip(hit[0], networks, strict=True)):
        models = [native_network(n) for n in networks]
        hit = (tuple(networks), models, tuple(_params_key(m) for m in models))
    _CONVERTED[ids] = hit
    if len(_CONVERTED) > 16:
        _CONVERTED.popitem(last=False)
    return hit[1], hit[2]


class NativeChooser:
    """``variopath``'s choice in the C++ core (ffi/choice.h), its only implementation: Algorithm
    2, the concurrent, multipath, staged, staged-balanced, paced, rot-paced and chained families,
    the analytic predictor and the robust choice; the op's decisions made ahead and applied."""

    def __init__(self, catalog: Catalog, model: PathModel, params: PlannerParams) -> None:
        self.planner = NativePlanner(catalog, model, params)
        self.model = model
        dep, self._routes = native_choice_deployment(catalog, model)
        self._core = _native().Chooser(self.planner._core, dep)
        self._screened: dict[tuple, bool] = {}
        # when it was last readied (built, or screened under new models): the call that readied
        # it does not count that in its planning time (a deployment pays it once)
        self.ready_at = time.perf_counter()

    def algorithm2_pays(self, networks: tuple[NetworkModel, ...]) -> bool:
        """Whether Algorithm 2's plans (barrier, signal) are worth planning on this deployment
        under ``networks``: on a 256-shape catalog they cost 0.3-0.8 s a call (R5090-BF3-32,
        ``benchmarks/bench_planner.py choice``), so the choice keeps them only where they win it
        on one of ``screen_demands`` (MoE dispatch and Zipf traffic from small to large),
        where each choice runs them only if they may pay for their planning
        (``ChoiceCore::algorithm2_work_s``). Decided once per deployment and models,
        deterministically, like the catalog itself."""
        key = converted_networks(networks)[1]
        if key not in self._screened:
            n = self.model.topology.num_ranks
            self._screened[key] = any(
                self.choose(demand, networks)[1]["plan"] in ALGORITHM2_PLANS
                for demand in screen_demands(n)
            )
            self.ready_at = time.perf_counter()
        return self._screened[key]

    def choose(
        self,
        demand: np.ndarray,
        networks: tuple[NetworkModel, ...],
        warm: np.ndarray | None = None,
        rank: int | None = None,
        algorithm2: bool = True,
        hybrid: bool = True,
        every: bool = False,
    ) -> tuple[Schedule, dict]:
        """The chosen schedule and the choice's record: ``plan``, ``predicted_s[model]
        [candidate]``, ``regret``, ``fractions`` (the paced split, to warm-start the next call),
        ``endpoint_s`` (the endpoint bound: the busiest rank's bytes at its endpoint's rate),
        ``cap_bps`` (per transfer of the schedule, its pacing cap or 0), ``plan_s`` (the core's
        call from Python) and ``core_s`` (the same timed in C++: Algorithm 2 ``paper_s``, the
        other families ``build_s``, the paced split ``split_s``, the predictions ``predict_s``).
        ``algorithm2=False`` leaves Algorithm 2's plans out (``algorithm2_pays``; with ``True``
        they are still built only where they may pay for their planning, as are ``paced`` and
        ``chained``; ``paper_s`` and
        ``split_s`` are 0 where they are not; ``every=True`` builds them whatever their planning
        costs), ``hybrid=False`` the chained plan (built in C++ after paced: ``hybrid_s``); with
        ``rank``, a chosen paced plan holds only the transfers that rank sends or receives
        (``ChoiceCore::expand``)."""
        checked = validate_demand(demand, self.model.topology.num_ranks)
        models = converted_networks(networks)[0]
        start_from = [] if warm is None else [float(x) for x in warm]
        start = time.perf_counter()
        out = self._core.choose(
            checked,
            self.planner._params,
            models,
            start_from,
            -1 if rank is None else int(rank),
            algorithm2,
            hybrid,
            every,
        )
        seconds = time.perf_counter() - start
        cands = list(out["candidates"])
        labels = model_names(networks)
        record = {
            "plan": out["plan"],
            "predicted_s": {
                m: dict(zip(cands, out["predicted"][k], strict=True)) for k, m in enumerate(labels)
            },
            "regret": dict(zip(cands, out["regret"], strict=True)),
            "fractions": out["fractions"],
            # the most mirror-prox iterations the split was given (-1: not solved)
            "split_iterations": out["split_iterations"],
            "endpoint_s": out["endpoint_s"],  # the endpoint bound: no plan moves it faster
            "cap_bps": out["cap_bps"],  # per transfer: its pacing cap, 0 at its path's rate
            "plan_s": seconds,  # the call from Python, its result converted included
            # the same call timed in C++, what the op's handler pays, and its parts
            **{
                k: out[k]
                for k in ("core_s", "paper_s", "build_s", "split_s", "hybrid_s", "predict_s")
            },
        }
        return self._schedule(out), record

    def decide(
        self,
        demand: np.ndarray,
        networks: tuple[NetworkModel, ...],
        *,
        algorithm2: bool = True,
        hybrid: bool = True,
    ) -> tuple[object, dict]:
        """The op's decision made ahead of a call from ``demand`` (a call site's previous one,
        docs/planner.md "Deciding ahead"): the family, and the paced families' split, chosen under
        ``networks`` as :meth:`choose` chooses, the paced split solved in full (it is off the call
        path); ``decision.plan`` names the family, ``decision.id`` what the ranks compare. The
        record: ``plan``, ``predicted_s[model][candidate]``, ``regret``, ``call_path_s[candidate]``
        (what applying it costs on the call path, estimated) and ``decide_s`` (this call, timed
        in C++)."""
        checked = validate_demand(demand, self.model.topology.num_ranks)
        models = converted_networks(networks)[0]
        decision, out = self._core.decide(checked, self.planner._params, models, algorithm2, hybrid)
        cands = list(out["candidates"])
        record = {
            "plan": out["plan"],
            "predicted_s": {
                m: dict(zip(cands, out["predicted"][k], strict=True))
                for k, m in enumerate(model_names(networks))
            },
            "regret": dict(zip(cands, out["regret"], strict=True)),
            # per candidate, what applying it costs on the call path (estimated, cold), which
            # the choice adds to its predicted time under every model
            "call_path_s": dict(zip(cands, out["call_path_s"], strict=True)),
            "decide_s": out["decide_s"],  # deciding, timed in C++ (off the call path)
        }
        return decision, record

    def apply(
        self,
        decision: object,
        demand: np.ndarray,
        networks: tuple[NetworkModel, ...],
        rank: int | None = None,
        *,
        algorithm2: bool = True,
    ) -> Schedule:
        """The plan the op runs for ``demand`` under ``decision`` (``ChoiceCore::apply``: the
        decided family built for this demand; with ``rank``, only that rank's transfers where the
        family allows); ``meta["plan"]``, ``meta["apply_s"]`` (timed in C++) and, for the whole
        plan, ``meta["predicted_s"][model]`` (``ChoiceCore::predict``, as the choice predicts)."""
        checked = validate_demand(demand, self.model.topology.num_ranks)
        models = converted_networks(networks)[0]
        out = self._core.apply(
            decision,
            checked,
            self.planner._params,
            models,
            algorithm2,
            -1 if rank is None else rank,
        )
        schedule = self._schedule(out)
        schedule.meta.update({"plan": out["plan"], "apply_s": out["apply_s"]})
        if rank is None:
            predicted = zip(model_names(networks), out["predicted"], strict=True)
            schedule.meta["predicted_s"] = dict(predicted)
        return schedule

    def apply_work_s(
        self, decision: object, demand: np.ndarray, networks: tuple[NetworkModel, ...]
    ) -> float:
        """What the choice estimates applying ``decision`` to ``demand`` costs on the op's call
        path, cold (``ChoiceCore::call_path_s``; ``benchmarks/bench_call_path.py`` measures it)."""
        checked = validate_demand(demand, self.model.topology.num_ranks)
        models = converted_networks(networks)[0]
        return self._core.apply_work_s(decision, checked, self.planner._params, models)

    def critical_path_s(
        self,
        decision: object,
        demand: np.ndarray,
        networks: tuple[NetworkModel, ...],
        rank: int = 0,
        *,
        repeats: int = 25,
        flush_bytes: int = 64 << 20,
        algorithm2: bool = True,
    ) -> list[float]:
        """Seconds of each of ``repeats`` calls of exactly what the op does on its call path
        once the counts are read (``layout.h critical_path``: the decision applied for ``rank``,
        converted to the executed plan and checked), each after ``flush_bytes`` of other memory
        traffic (cold, as between the calls of a model step), timed in C++."""
        checked = validate_demand(demand, self.model.topology.num_ranks)
        models = converted_networks(networks)[0]
        return list(
            self._core.critical_path_s(
                decision,
                checked,
                self.planner._params,
                models,
                algorithm2,
                rank,
                repeats,
                flush_bytes,
            )
        )

    def planning_estimates(self, demand: np.ndarray) -> dict:
        """What the choice's gates expect building each costly candidate for ``demand`` to cost
        (s; ffi/choice.h, constants measured by ``benchmarks/bench_planner.py``), and the counts
        behind each: ``split_s`` and ``split_units`` (the paced split at its iteration cap),
        ``rotation_s`` (None where the demand has no rotation), ``chained_s`` and
        ``chained_column_iterations``, ``algorithm2_s`` and ``algorithm2_activations`` (a lower
        bound on Algorithm 2's activations)."""
        checked = validate_demand(demand, self.model.topology.num_ranks)
        return dict(self._core.planning_estimates(checked))

    def chained(
        self, demand: np.ndarray, network: NetworkModel, floor_s: float = 0.0
    ) -> Schedule | None:
        """The C++ core's chained hybrid plan alone (ffi/chained.cc; gaps of ``network``, stopping
        at ``floor_s``), or None where no reserved rate leaves every link
        room; ``meta["core_s"]``: the C++ call's time."""
        checked = validate_demand(demand, self.model.topology.num_ranks)
        out = self._core.chained(checked, native_network(network), float(floor_s))
        if out is None:
            return None
        schedule = self._schedule(out)
        schedule.meta["core_s"] = out["core_s"]  # the C++ call alone
        return schedule

    def _schedule(self, out: dict) -> Schedule:
        """The C++ choice's flat arrays as the schedule IR (classes of Algorithm 2's lanes as
        :class:`NativePlanner` names them), each step's transfers built when first read
        (:class:`LazySteps`: the plan is made when the core returns; the Python objects, about
        1.5–4 µs a transfer by ``bench_planner.py choice``, are paid by whoever reads them)."""
        plan = out["plan"]
        group_of = self.model.group_of

        @functools.cache
        def columns() -> list[list]:
            # as Python lists, once: indexing the arrays element by element costs several times
            # more (0.4 s of a 256-GPU paced schedule's 65,000 transfers)
            return [
                np.asarray(out[k]).tolist()
                for k in (
                    "lane_kind", "lane_inst", "src", "dst", "route", "bytes", "rate", "link_ptr",
                    "links", "staged", "after_ptr", "after_step", "after_index", "step_ptr",
                )
            ]  # fmt: skip

        def step(s: int) -> Step:
            kind, inst, src, dst, route, nbytes, rate, link_ptr, links, staged, *rest = columns()
            after_ptr, after_step, after_index, step_ptr = rest
            transfers = []
            for t in range(step_ptr[s], step_ptr[s + 1]):
                i, j = src[t], dst[t]
                if route[t] >= 0:
                    cls = self._routes[route[t]].cls
                elif kind[t] in (LaneKind.FLAT, LaneKind.INTRA):
                    cls = self.planner._classes[inst[t]]
                elif kind[t] == LaneKind.NET:
                    cls = "NET"
                else:
                    cls = self.model.nearest(int(group_of[i]), int(group_of[j])).cls
                first, last = after_ptr[t], after_ptr[t + 1]
                after = (
                    tuple(zip(after_step[first:last], after_index[first:last], strict=True))
                    if last > first
                    else ()
                )
                path = tuple(links[link_ptr[t] : link_ptr[t + 1]])
                transfers.append(
                    Transfer(i, j, path, nbytes[t], (i, j), rate[t], cls, bool(staged[t]), after)
                )
            over = float(out["step_overhead"][s])
            return Step(
                tuple(transfers),
                deps=None if out["step_chain"][s] else (),
                overhead=None if over < 0 else over,
            )

        steps = LazySteps(len(out["step_ptr"]) - 1, step)
        meta = {"scheduler": "variopath", "activations": len(steps)}
        if plan in ("paced", "rot-paced"):
            meta.update({"paced": True, "horizon_s": out["horizon_s"], "split": "mirror-prox"})
        elif plan == "chained":
            meta.update({"paced": True, "hybrid": "chained"})
        return Schedule(
            self.model.topology.num_ranks,
            steps,
            self.model.topology.fingerprint,
            self.planner.params.lambda_s,
            "channel" if plan == "barrier" else "general",
            meta,
        )
