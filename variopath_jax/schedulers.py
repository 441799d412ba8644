"""Schedulers register here by name; ``variopath run --scheduler NAME`` looks them up.

A scheduler is a function ``(PlanRequest) -> Schedule``. Every producer of schedules emits the
same IR (:mod:`variopath_jax.schedule`), so nothing downstream knows which one made it.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from variopath_jax.errors import VarioPathError
from variopath_jax.schedule import Transfer
from variopath_jax.sim.network import NetworkModel, load_networks
from variopath_jax.topology import PathModel, Route

# Modules whose import registers the built-in schedulers.
_BUILTIN_MODULES = ("variopath_jax.baselines", "variopath_jax.planner")


@dataclass(frozen=True)
class PlanRequest:
    """Everything a scheduler may look at for one AlltoAllv call: ``network`` is the model the
    schedule will be judged (simulated) under, for schedulers that plan for it; several models
    (a sequence, or a comma-separated string of names and files) when the machine's is not known,
    and None when not said (model-aware schedulers then plan for
    :data:`~variopath_jax.sim.network.UNPROFILED_MODELS`)."""

    demand: np.ndarray
    model: PathModel
    lambda_s: float
    seed: int = 0
    options: Mapping[str, Any] = field(default_factory=dict)
    network: NetworkModel | str | Sequence[NetworkModel | str] | None = None

    @functools.cached_property
    def networks(self) -> tuple[NetworkModel, ...]:
        """The models to plan for: ``network`` as a tuple; when it is None, the unprofiled
        defaults, each with the request's λ as its barrier cost."""
        if self.network is None:
            return unprofiled_networks(self.lambda_s)
        return load_networks(self.network)


@functools.lru_cache(maxsize=16)
def unprofiled_networks(lambda_s: float) -> tuple[NetworkModel, ...]:
    """The unprofiled defaults with barrier cost ``lambda_s``: the same (immutable) objects for
    the same λ, so that what is derived from them per model object (their C++ form,
    ``planner/native.py converted_networks``) is derived once, not per request."""
    return tuple(m.replace(barrier_s=lambda_s) for m in load_networks(None))


Scheduler = Callable[[PlanRequest], Any]


@dataclass(frozen=True)
class SchedulerInfo:
    """A registered scheduler; ``model_aware``: its plan depends on ``PlanRequest.network``."""

    name: str
    summary: str
    plan: Scheduler
    model_aware: bool = False


SCHEDULERS: dict[str, SchedulerInfo] = {}


def register(
    name: str, summary: str, model_aware: bool = False
) -> Callable[[Scheduler], Scheduler]:
    def wrap(fn: Scheduler) -> Scheduler:
        if name in SCHEDULERS and SCHEDULERS[name].plan is not fn:
            raise VarioPathError(f"scheduler {name!r} is registered twice")
        SCHEDULERS[name] = SchedulerInfo(name, summary, fn, model_aware)
        return fn

    return wrap


def _load_builtins() -> None:
    for module in _BUILTIN_MODULES:
        importlib.import_module(module)


def get_scheduler(name: str) -> SchedulerInfo:
    _load_builtins()
    if name not in SCHEDULERS:
        raise VarioPathError(
            f"unknown scheduler {name!r}; known schedulers: {', '.join(sorted(SCHEDULERS))}"
        )
    return SCHEDULERS[name]


def scheduler_names() -> list[str]:
    _load_builtins()
    return sorted(SCHEDULERS)


def transfer(
    model: PathModel,
    i: int,
    j: int,
    route: Route,
    nbytes: int,
    carries: tuple[int, int] | None = None,
) -> Transfer:
    """A transfer of ``nbytes`` from rank i to rank j along a route (direct unless ``carries``)."""
    path = model.path(i, j, route)
    return Transfer(
        i, j, path.links, int(nbytes), carries or (i, j), route.rate, route.cls, route.staged
    )
