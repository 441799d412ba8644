"""Which topology and catalog the JAX op plans against, configured once per process.

``configure(topology, ...)`` builds (or loads from the disk cache) the topology's catalog, builds
the C++ planner core for it and registers it under an id derived from its content (topology
fingerprint, rank map, planner knobs, execution, timeout, debug): the op passes that id to its
FFI call as an attribute, never a pointer, so an executable compiled in one process (JAX's
persistent compilation cache) plans against the same configuration in another that configured
the same thing, whatever the order. Without a configuration, the first call builds the default
for the device count (``default_topology``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import threading
from dataclasses import dataclass

from variopath_jax.catalog import catalog_for, store
from variopath_jax.errors import VarioPathError
from variopath_jax.planner import PlannerParams
from variopath_jax.planner.native import native_deployment, native_params
from variopath_jax.topology import PathModel, Topology, load_topology, preset
from variopath_jax.topology.presets import NodeBuilder

# presets whose one node has exactly this many GPUs
_PRESET_BY_SIZE = {6: "fig1", 8: "r5080-bf3", 16: "l20-cx7"}


@dataclass(frozen=True)
class OpConfig:
    """A registered configuration: the topology, its mesh-to-topology rank map and planner knobs."""

    id: int
    topology: Topology
    rank_map: tuple[int, ...]
    params: PlannerParams
    execution: str
    timeout_s: float
    debug: bool

    @property
    def ranks(self) -> int:
        return self.topology.num_ranks


# How the op executes the planned activations (ffi/collective.h Execution):
EXECUTIONS = (
    "signal",  # default: each transfer waits for its sender's and receiver's previous activation
    "barrier",  # the paper's Algorithm 2: every activation behind a barrier
    "concurrent",  # no planning: every pair at once in one step
)
_lock = threading.Lock()
_current: OpConfig | None = None
_defaults: dict[int, OpConfig] = {}


def default_topology(devices: int) -> Topology:
    """The topology planned against when none is configured: the one-node preset with that many
    GPUs (6: fig1, 8: r5080-bf3, 16: l20-cx7), else a synthetic single-socket node with one Gen5
    switch per two GPUs, each with a 400 Gb/s NIC (one GPU per switch for an odd count)."""
    if devices < 1:
        raise VarioPathError(f"no devices: {devices}")
    if devices in _PRESET_BY_SIZE:
        return preset(_PRESET_BY_SIZE[devices])
    b = NodeBuilder()
    b.cpu("cpu0", 0)
    per = 2 if devices % 2 == 0 else 1
    for k in range(devices // per):
        sw = b.switch(f"sw{k}", "cpu0", 64.0)
        for _ in range(per):
            b.gpu(sw, 64.0)
        b.nic(sw, 64.0, 400.0)
    return Topology(b.build(), name=f"cpu-{devices}")


def configure(
    topology: Topology | str | None = None,
    *,
    devices: int | None = None,
    nodes: int | None = None,
    rank_map: list[int] | None = None,
    params: PlannerParams | None = None,
    execution: str = "signal",
    timeout_s: float = 60.0,
    debug: bool = False,
    nic_policy: str = "nearest",
) -> OpConfig:
    """Configure the op for this process and return the configuration (also made current).

    Parameters
    ----------
    topology : Topology, preset name or topology file, optional
        Default: ``default_topology(devices)``.
    devices : int, optional
        The mesh axis size, when ``topology`` is not given (default: ``jax.device_count()``).
    rank_map : list of int, optional
        ``rank_map[p]`` is the topology rank of mesh-axis position ``p`` (default: identity).
    params : PlannerParams, optional
        Planner knobs (K_target, starts, sweeps, λ, seed).
    execution : str
        How the planned activations run: ``"signal"`` (default; the ``signal`` plan of the
        ``variopath`` scheduler: each transfer waits only for its sender's and receiver's
        previous activation), ``"barrier"`` (the paper's Algorithm 2 as it runs it) or
        ``"concurrent"`` (no planning; every pair at once, the ``concurrent`` plan).
    timeout_s : float
        Every wait of the collective gives up after this long with an error naming who is missing.
    debug : bool
        Keep the demand and the executed transfers of each call site (``last_schedule``).
    """
    global _current
    nat = _native_module()
    if topology is None:
        if devices is None:
            import jax

            devices = jax.device_count()
        topo = default_topology(devices)
    elif isinstance(topology, Topology):
        topo = topology if nodes is None else topology.with_nodes(nodes)
    else:
        topo = load_topology(topology, nodes)
    n = topo.num_ranks
    rmap = tuple(range(n)) if rank_map is None else tuple(int(r) for r in rank_map)
    if sorted(rmap) != list(range(n)):
        raise VarioPathError(
            f"rank_map must be a permutation of the topology's {n} ranks, got {list(rmap)}"
        )
    if timeout_s <= 0:
        raise VarioPathError(f"timeout_s must be > 0, got {timeout_s}")
    if execution not in EXECUTIONS:
        raise VarioPathError(f"execution must be one of {', '.join(EXECUTIONS)}, got {execution!r}")
    params = params or PlannerParams()
    model = PathModel(topo, nic_policy=nic_policy)
    catalog = catalog_for(model)
    content = {
        "topology": topo.fingerprint,
        "nic_policy": nic_policy,
        "rank_map": rmap,
        "params": dataclasses.asdict(params),
        "execution": execution,
        "timeout_s": float(timeout_s),
        "debug": bool(debug),
    }
    config = OpConfig(
        config_id(content), topo, rmap, params, execution, float(timeout_s), bool(debug)
    )
    nat.register_op_config(
        config.id,
        store.dumps(catalog),
        catalog.fingerprint,
        native_deployment(catalog, model),
        list(rmap),
        native_params(params),
        getattr(nat.Execution, execution.upper()),
        config.timeout_s,
        config.debug,
    )
    with _lock:
        _current = config
    return config


def config_id(content: dict) -> int:
    """A configuration's id: 63 bits of a hash of what it is (never 0)."""
    digest = hashlib.blake2b(json.dumps(content, sort_keys=True).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1 or 1


def release(config: OpConfig) -> None:
    """Free a configuration's planner; calls compiled against it fail with a clear error after.
    The process's current configuration is released too when it is this one."""
    global _current
    _native_module().unregister_op_config(config.id)
    with _lock:
        if _current is not None and _current.id == config.id:
            _current = None
        for devices, cfg in list(_defaults.items()):
            if cfg.id == config.id:
                del _defaults[devices]


def _native_module():
    from variopath_jax import _native

    return _native


def current_config(devices: int) -> OpConfig:
    """The configured topology, or the default for ``devices`` (built once per size)."""
    global _current
    with _lock:
        config = _current
    if config is not None:
        return config
    if devices not in _defaults:
        cfg = configure(devices=devices)
        with _lock:
            _current = None  # a default does not become the process-wide configuration
        _defaults[devices] = cfg
    return _defaults[devices]
