"""VarioPath and its ablations as registered schedulers (``variopath run --scheduler ...``).

- ``variopath-paper``: Algorithm 2 on the topology's catalog (flat for one node, factored
  beyond), planned by the C++ core (``planner="python"`` selects the reference).
- ``variopath``: the C++ core's choice (ffi/choice.h): of Algorithm 2's plans, the concurrent,
  multipath, staged, paced, rot-paced and chained families, the fastest predicted under the
  request's network model (several models: the least regret).
- ``variopath-robust``: ``variopath`` planned once over the unprofiled models (``pcie`` and
  ``pcie-fair``) whatever the request's model: the candidate of least regret. Not model-aware:
  ``bench`` plans it once and judges it under every model.
- ``variopath-fixed-path``: demand-aware peers, each group pair restricted to its nearest path
  (the paper's Table 3 "demand-aware peers, fixed nearest path"): the catalog of the
  nearest-only path model, same planner.
- ``variopath-fixed-peer``: a cyclic peer rotation (stage k: rank i sends to i+k, as pairwise
  exchange), paths adaptive: every activation gives each pending lane of the stage, largest
  remaining first, the fastest candidate path that shares no resource with the lanes already
  placed; a lane that finds none waits for the next activation of its stage (Table 3 "fixed peer
  rotation, dynamic path").
- ``op``: what the JAX op runs for the demand in steady state: the decision the C++ core made
  ahead from the call site's previous demand, applied to this one; its ``plan_s`` is the planning
  left on the call path, measured cold (``plan_op``). Not model-aware: it decides under the op's
  default models (``pcie`` and ``pcie-fair``) unless the request names others.

Options (``PlanRequest.options``): ``k_target``, ``starts``, ``sweeps``, ``granularity``,
``max_candidates``; for ``variopath-paper`` and ``variopath-fixed-path``: ``planner`` ("cpp",
or "python": Algorithm 2's reference, ``planner/reference.py``); for ``variopath``: ``hybrid``
(true: ``chained`` where it may pay for its planning, as the op chooses; "all": every candidate
(paced, Algorithm 2's plans where the deployment's screen keeps them, chained) whatever its
planning costs, for studies of plans rather than of calls; false: no ``chained``); for ``op``:
``previous`` (the call site's previous demand, default this one), ``repeats`` and
``flush_bytes`` (how its planning is timed).
"""

from __future__ import annotations

import atexit
import dataclasses
import time
from collections import OrderedDict

import numpy as np

from variopath_jax.catalog import Catalog, catalog_for
from variopath_jax.errors import VarioPathError
from variopath_jax.planner.native import NativeChooser
from variopath_jax.planner.reference import PlannerParams, ReferencePlanner, quantum
from variopath_jax.schedule import Schedule, Step
from variopath_jax.schedulers import PlanRequest, register, transfer
from variopath_jax.topology import PathModel, Topology
from variopath_jax.workloads import validate_demand


def params_of(req: PlanRequest) -> PlannerParams:
    o = req.options
    return PlannerParams(
        lambda_s=req.lambda_s,
        k_target=o.get("k_target"),
        starts=int(o.get("starts", 4)),
        sweeps=int(o.get("sweeps", 3)),
        seed=req.seed,
        granularity=o.get("granularity", "auto"),
        max_candidates=int(o.get("max_candidates", 8)),
    )


_CATALOGS: OrderedDict[tuple[Topology, str], Catalog] = OrderedDict()


def _catalog(model: PathModel) -> Catalog:
    """The model's catalog, kept in memory for the 32 path models used last."""
    key = (model.topology, model.identity())
    if key not in _CATALOGS:
        _CATALOGS[key] = catalog_for(model)
        if len(_CATALOGS) > 32:
            _CATALOGS.popitem(last=False)
    _CATALOGS.move_to_end(key)
    return _CATALOGS[key]


def make_planner(model: PathModel, params: PlannerParams, planner: str = "cpp"):
    """A planner for this path model's catalog (cached in memory and on disk)."""
    from variopath_jax.planner.native import NativePlanner

    catalog = _catalog(model)
    cls = NativePlanner if planner == "cpp" else ReferencePlanner
    return cls(catalog, model, params)


def _plan(req: PlanRequest, only_nearest: bool) -> Schedule:
    model = req.model
    if only_nearest and not model.only_nearest:
        model = model.replace(only_nearest=True)
    planner = make_planner(model, params_of(req), req.options.get("planner", "cpp"))
    schedule = planner.plan(req.demand)
    schedule.meta["scheduler"] = "variopath-fixed-path" if only_nearest else "variopath-paper"
    schedule.meta["plan_s"] = planner.stats.seconds
    return schedule


@register(
    "variopath-paper",
    "the paper's VarioPath: Algorithm 2's activations over the catalog, behind barriers (§4)",
)
def plan_variopath_paper(req: PlanRequest) -> Schedule:
    return _plan(req, only_nearest=False)


@register(
    "variopath",
    "VarioPath: of Algorithm 2's plan (barrier or signal-driven) and all-concurrent plans, the "
    "fastest predicted under the network model (several models: the least regret)",
    model_aware=True,
)
def plan_variopath(req: PlanRequest) -> Schedule:
    return _plan_choice(req)


_CHOOSERS: OrderedDict[tuple, NativeChooser] = OrderedDict()
atexit.register(_CHOOSERS.clear)  # release the native cores before the interpreter goes


_LAST_CHOOSER: list[tuple[PathModel, PlannerParams, NativeChooser]] = []
atexit.register(_LAST_CHOOSER.clear)


def last_chooser(model: PathModel, params: PlannerParams) -> NativeChooser | None:
    """The chooser of ``chooser_for``'s last call if it was for this very model object and
    these knobs, else None."""
    if _LAST_CHOOSER and _LAST_CHOOSER[0][0] is model and _LAST_CHOOSER[0][1] == params:
        return _LAST_CHOOSER[0][2]
    return None


def chooser_for(model: PathModel, params: PlannerParams) -> NativeChooser:
    """The C++ choice for this path model and Algorithm 2's knobs, kept for the 8 used last
    (its route tables are built once per topology); the one of the last call is found by the
    model object itself, before hashing its topology."""
    last = last_chooser(model, params)
    if last is not None:
        return last
    key = (model.topology, model.identity(), params)
    if key not in _CHOOSERS:
        _CHOOSERS[key] = NativeChooser(_catalog(model), model, params)
        if len(_CHOOSERS) > 8:
            _CHOOSERS.popitem(last=False)
    _CHOOSERS.move_to_end(key)
    _LAST_CHOOSER[:] = [(model, params, _CHOOSERS[key])]
    return _CHOOSERS[key]


def _plan_choice(req: PlanRequest) -> Schedule:
    """``variopath``'s model-aware choice, made by the C++ core (ffi/choice.h): Algorithm 2's
    plans are candidates only where the deployment's screen keeps them
    (``NativeChooser.algorithm2_pays``) and, call by call, where they may pay for their planning;
    ``options["hybrid"]`` (module docstring) says which of ``chained`` and the costly candidates
    take part."""
    which = req.options.get("hybrid", True)
    if which not in (True, False, "all"):
        raise VarioPathError(f"options['hybrid'] must be true, false or 'all', got {which!r}")
    # plan_s counts finding the chooser and the screen's verdict, as every call pays them, but
    # not building them, which a deployment pays once (its catalog, the screen's six choices)
    start = time.perf_counter()
    chooser = chooser_for(req.model, params_of(req))
    algorithm2 = chooser.algorithm2_pays(req.networks)
    if chooser.ready_at >= start:  # this call built it or screened it
        start = time.perf_counter()
    schedule, record = chooser.choose(
        req.demand,
        req.networks,
        algorithm2=algorithm2,
        hybrid=which is not False,
        every=which == "all",
    )
    schedule.meta.update(
        {
            "scheduler": "variopath",
            "plan": record["plan"],
            "networks": list(record["predicted_s"]),
            "predicted_s": record["predicted_s"],
            "regret": record["regret"],
            "network": ",".join(record["predicted_s"]),
            "core_s": record["core_s"],  # the C++ core's call, timed in C++
            "algorithm2": algorithm2,  # the deployment's screen kept Algorithm 2's plans
            # and this call ran it: they may pay for their planning
            "algorithm2_run": "barrier" in record["regret"],
            "plan_s": time.perf_counter() - start,
        }
    )
    return schedule


@register(
    "variopath-robust",
    "VarioPath planned once, without knowing the machine: the candidate of least regret over "
    "the pcie and pcie-fair models (the op's default models)",
)
def plan_variopath_robust(req: PlanRequest) -> Schedule:
    robust = dataclasses.replace(req, network=None)  # the unprofiled models, at the request's λ
    schedule = _plan_choice(robust)
    schedule.meta["scheduler"] = "variopath-robust"
    return schedule


# ``op``'s planning on the call path: the median of this many calls, each after this many bytes of
# other memory traffic (a model step's between two calls of the op: the planning measured cold)
OP_REPEATS = 25
OP_FLUSH_BYTES = 64 << 20


@register(
    "op",
    "what the JAX op runs for this demand in steady state: the C++ core's decision made ahead "
    "from the call site's previous demand (default the same demand), under the op's default "
    "models (pcie and pcie-fair) unless told others, applied to this demand; plan_s: its "
    "planning on the call path, measured cold",
)
def plan_op(req: PlanRequest) -> Schedule:
    """The op's plan in steady state (``ffi/decider.h``): the decision made ahead from the call
    site's previous demand (``options["previous"]``, a demand matrix; default this very demand)
    by ``NativeChooser.decide``, under ``req.network`` where the request names models (``run_one``'s
    ``plan_for``) and the op's default, the unprofiled models at the request's λ, where it does
    not; then applied to this demand (``NativeChooser.apply``, the whole schedule). ``plan_s`` is
    what a call pays on its call path after the counts are read, for rank 0, measured cold
    (``NativeChooser.critical_path_s``: the median of ``options["repeats"]``, default
    ``OP_REPEATS``, calls, each after ``options["flush_bytes"]``, default ``OP_FLUSH_BYTES``, of
    other memory traffic); deciding is off the call path and not counted."""
    o = req.options
    n = req.model.topology.num_ranks
    previous = o.get("previous")
    if previous is None:
        previous, decided_from = req.demand, "same demand"
    else:
        previous = validate_demand(previous, n, "the previous demand (options['previous'])")
        same = np.array_equal(previous, req.demand)
        decided_from = "same demand" if same else "previous demand"
    repeats = int(o.get("repeats", OP_REPEATS))
    flush_bytes = int(o.get("flush_bytes", OP_FLUSH_BYTES))
    if repeats < 1 or flush_bytes < 0:
        raise VarioPathError(
            f"options['repeats'] must be >= 1 and options['flush_bytes'] >= 0, got {repeats} "
            f"and {flush_bytes}"
        )
    networks = req.networks  # the unprofiled models at the request's λ where none are named
    chooser = chooser_for(req.model, params_of(req))
    # Algorithm 2's plans only where the deployment's screen keeps them, as the op's configuration
    # decides (jax_ops/config.py)
    algorithm2 = chooser.algorithm2_pays(networks)
    decision, record = chooser.decide(previous, networks, algorithm2=algorithm2, hybrid=True)
    schedule = chooser.apply(decision, req.demand, networks, algorithm2=algorithm2)
    times = chooser.critical_path_s(
        decision,
        req.demand,
        networks,
        rank=0,
        repeats=repeats,
        flush_bytes=flush_bytes,
        algorithm2=algorithm2,
    )
    schedule.meta.update(
        {
            "scheduler": "op",
            "plan": schedule.meta.get("plan", decision.plan),
            "decision": decision.plan,  # the family decided ahead
            "decision_id": int(decision.id),
            "decided_from": decided_from,
            "networks": list(record["predicted_s"]),
            "predicted_s": record["predicted_s"],  # of the demand decided from
            "regret": record["regret"],
            "network": ",".join(record["predicted_s"]),
            "algorithm2": algorithm2,
            "plan_s": float(np.median(times)),  # the call path's planning, rank 0, cold
            "plan_s_min": float(min(times)),
            "plan_repeats": repeats,
            "flush_bytes": flush_bytes,
        }
    )
    return schedule


@register(
    "variopath-fixed-path", "ablation: demand-aware peers, each pair on its nearest path (Table 3)"
)
def plan_fixed_path(req: PlanRequest) -> Schedule:
    return _plan(req, only_nearest=True)


@register(
    "variopath-fixed-peer",
    "ablation: cyclic peer rotation with adaptive, contention-free paths (Table 3)",
)
def plan_fixed_peer(req: PlanRequest) -> Schedule:
    model, params = req.model, params_of(req)
    rem = np.array(req.demand, dtype=np.int64)
    n = len(rem)
    tau, _ = quantum(rem, model, params)
    group_of = model.group_of
    endpoint = {lid for i in range(n) for lid in model.endpoint_links(i)}
    steps = []
    for k in range(1, n):
        while True:
            lanes = [
                (int(rem[i, (i + k) % n]), i, (i + k) % n)
                for i in range(n)
                if rem[i, (i + k) % n] > 0
            ]
            if not lanes:
                break
            used: set[int] = set()
            transfers = []
            for _, i, j in sorted(lanes, key=lambda x: (-x[0], x[1])):
                for r in model.routes(int(group_of[i]), int(group_of[j])):  # fastest first
                    if used & set(r.links):
                        continue
                    path = model.path(i, j, r)
                    used |= {lid for lid in path.links if lid not in endpoint}
                    x = min(int(rem[i, j]), max(1, int(np.floor(tau * r.rate * 1e9))))
                    transfers.append(transfer(model, i, j, r, x))
                    rem[i, j] -= x
                    break
            steps.append(Step(tuple(transfers)))
    meta = {"scheduler": "variopath-fixed-peer", "tau_s": tau, "activations": len(steps)}
    return Schedule(n, steps, model.topology.fingerprint, req.lambda_s, "channel", meta)
