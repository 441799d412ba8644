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
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from variopath_jax import _native
from variopath_jax.catalog import catalog_for, store
from variopath_jax.errors import VarioPathError
from variopath_jax.jax_ops import _compat, nccl, peers, shm
from variopath_jax.planner import PlannerParams
from variopath_jax.planner.native import (
    native_choice_deployment,
    native_deployment,
    native_network,
    native_params,
)
from variopath_jax.planner.schedulers import chooser_for
from variopath_jax.schedule import Schedule
from variopath_jax.sim.network import NetworkModel, NetworkSpec, load_networks
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
    transport: str = "memcpy"
    transport_reason: str = ""  # why configure chose the transport
    staging_budget: int = 0  # bytes of staging one process may hold (0: unbounded)

    @property
    def ranks(self) -> int:
        return self.topology.num_ranks


# How the op executes the planned activations (ffi/collective.h Execution):
EXECUTIONS = (
    "planned",  # default: `variopath`'s choice under `network` in the C++ core, executed as planned
    "signal",  # Algorithm 2's activations, each after its sender's, receiver's and links' previous
    "barrier",  # the paper's Algorithm 2: every activation behind a barrier
    "concurrent",  # no planning: every pair at once in one step
    "model-aware",  # the Python scheduler's plan, by a callback: the debugging reference
)
TRANSPORTS = (
    "memcpy",
    "emulated",
    "shm",
    "nccl",
    "cuda-ipc",
    "cuda-host",
)  # collective.h Transport
# bootstrapped through jax.distributed (jax_ops/shm.py), their staging bounded by staging_budget
_BETWEEN_PROCESSES = ("shm", "cuda-ipc", "cuda-host")
_EMULATED = ("emulated", "cuda-host")  # copies on the emulator (cuda-host: on CPU devices)


def transport_direction(transport: str) -> str:
    """How ``transport`` moves every transfer's bytes (ffi/collective.h ``direction_of``):
    ``"push"`` where the sender writes into the receiver's memory (memcpy, emulated, nccl),
    ``"pull"`` where the receiver reads the sender's (shm, cuda-ipc, cuda-host): the schedule IR's
    ``Transfer.pull``."""
    if transport not in TRANSPORTS:
        raise VarioPathError(f"transport must be one of {', '.join(TRANSPORTS)}, got {transport!r}")
    return _native.transport_direction(
        getattr(_native.Transport, transport.upper().replace("-", "_"))
    )


_lock = threading.Lock()
_current: OpConfig | None = None
_defaults: dict[int, OpConfig] = {}
# The current configuration's id, in every jitted function's cache key: a function traced under
# one configuration is traced again after ``configure`` changes it (``configure``'s docstring).
_JIT_KEY = _compat.jit_key_context()


def _make_current(config: OpConfig | None) -> None:
    """Make ``config`` the process's configuration (None: the default for each device count),
    and part of jit's cache key, so no function jitted before runs the old one."""
    global _current
    with _lock:
        _current = config
        _JIT_KEY.set_global(None if config is None else config.id)


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


DETECT_HINT = (
    "describe this machine with `variopath topo detect -o my-node.json` (add --nodes K for K "
    "such nodes) and configure('my-node.json'), or name a topology with as many GPUs"
)
_detected: dict[int, Topology] = {}


def _on_gpus() -> bool:
    """Whether this process's devices are GPUs."""
    return _local_platform() in ("gpu", "cuda")


def machine_topology(devices: int) -> Topology:
    """The topology ``configure()`` plans for on GPUs without one: this machine as ``variopath
    topo detect`` finds it (``topology.detect``, once per process), as many nodes as
    ``devices`` fills; an error naming ``topo detect`` where it cannot be found or does not
    divide ``devices``."""
    from variopath_jax.topology.detect import detect

    if 0 not in _detected:
        try:
            _detected[0] = detect().topology
        except VarioPathError as err:
            raise VarioPathError(
                f"configure() on GPUs without a topology plans for this machine, but: {err}. "
                "Run `variopath topo detect` with the options it asks for and "
                "configure('my-node.json'), or pass a topology"
            ) from None
    node = _detected[0]
    per = node.gpus_per_node
    if devices % per:
        raise VarioPathError(
            f"configure(): this machine has {per} GPUs (topo detect) but the mesh has {devices} "
            f"devices, not a multiple; {DETECT_HINT}"
        )
    return node.with_nodes(devices // per)


def _local_platform() -> str:
    import jax

    return jax.local_devices()[0].platform


def choose_transport(
    transport: str | None,
    process: int,
    processes: int,
    platform: str,
    built: list[str],
    hosts: Callable[[], int] = lambda: 1,
    peers: Callable[[], tuple[str, str]] = lambda: ("cuda-ipc", "assumed"),
) -> tuple[str, str]:
    """The transport ``configure`` uses and why (issue 16, "Several processes"; issue 29):
    ``transport`` (None: the default) for ``processes`` processes whose local devices are on
    ``platform``, with the transports this build has (``built``). ``hosts()`` counts the hosts
    the processes run on and ``peers()`` is ``peers.choose`` of their GPUs (key-value rounds,
    asked only for the default of several GPU processes). One process: ``memcpy``; several CPU
    processes: ``shm``; several GPU processes: on one host ``cuda-ipc`` where every pair has peer
    access, else ``cuda-host``; on several, ``nccl``. ``cuda-host`` on CPU devices is its CPU
    twin (for tests). A transport that cannot work there is refused naming the one that does."""
    gpu = platform in ("gpu", "cuda")
    asked = f"asked for (configure(transport={transport!r}))"
    if transport is None and processes > 1 and gpu:
        n = hosts()
        if n > 1:
            return _built("nccl", built), f"GPU processes on {n} hosts"
        chosen, why = peers()
        return _built(chosen, built), why
    if transport == "cuda-host" and not gpu:
        return transport, f"{asked}: its CPU twin (ordinary shared memory, the emulator's copies)"
    if transport in ("cuda-ipc", "cuda-host", "nccl"):
        if not gpu:
            other = "between CPU processes use transport='shm'"
            raise VarioPathError(
                f"transport {transport!r} moves GPU devices' rows, but this process's devices are "
                f"{platform}; {other}"
            )
        return _built(transport, built), asked
    if processes > 1:
        if transport not in (None, "shm") or gpu:
            use = (
                "'cuda-ipc' or 'cuda-host' (the default there) or 'nccl'"
                if gpu
                else "'shm' (the default there)"
            )
            raise VarioPathError(
                f"transport {transport!r} cannot move {platform} devices' rows between the "
                f"{processes} processes jax.distributed runs (this is process {process}); use "
                f"transport={use}"
            )
        return "shm", asked if transport else f"{processes} CPU processes of one host"
    if transport is None:
        return "memcpy", "one process: its devices' threads copy the rows"
    return transport, asked


def _built(transport: str, built: list[str]) -> str:
    """``transport`` if this build has it, else an error saying the build lacks CUDA."""
    if transport not in built:
        raise VarioPathError(
            f"transport {transport!r} is not in this build of variopath_jax, which has "
            f"{', '.join(built)}: it was built without CUDA (no nvcc at build time); rebuild "
            "it where nvcc is"
        )
    return transport


def configure(
    topology: Topology | str | None = None,
    *,
    devices: int | None = None,
    nodes: int | None = None,
    rank_map: list[int] | None = None,
    params: PlannerParams | None = None,
    execution: str = "planned",
    network: NetworkSpec | Sequence[NetworkSpec] | None = None,
    transport: str | None = None,
    emulator_seed: int = 0,
    emulator_delay_s: float = 50e-6,
    timeout_s: float = 60.0,
    debug: bool = False,
    nic_policy: str = "nearest",
    staging_budget: int | None = None,
) -> OpConfig:
    """Configure the op for this process and return the configuration (also made current).

    Parameters
    ----------
    topology : Topology, preset name or topology file, optional
        Default: on GPUs, this machine (``machine_topology``: what ``variopath topo detect``
        finds, the P2P and link generation probed), as many nodes as ``jax.device_count()``
        fills; on CPU devices, or with ``devices`` given, ``default_topology(devices)``. The op
        without any ``configure`` plans the same way. A topology whose rank count is not the
        mesh's is an error naming ``variopath topo detect``.
    devices : int, optional
        The mesh axis size, when ``topology`` is not given (default: ``jax.device_count()``).
    rank_map : list of int, optional
        ``rank_map[p]`` is the topology rank of mesh-axis position ``p`` (default: identity).
    params : PlannerParams, optional
        Planner knobs (K_target, starts, sweeps, λ, seed).
    execution : str
        What the op runs: ``"planned"`` (default): ``variopath``'s choice for ``network``, made
        by the C++ core ahead of each call, from the call site's previous demand, and applied to
        the call's counts (docs/planner.md "Deciding ahead"; ffi/choice.h: Algorithm 2's
        activations behind barriers or signal-driven, concurrent, multipath, staged,
        staged-balanced, paced, rot-paced and chained, predicted analytically, the robust
        choice; a call site's first call runs ``staged``) and executed as planned: its order,
        its dependencies and its pacing caps, enforced while the bytes move.
        ``"model-aware"``: the ``variopath`` scheduler's plan (the same C++ choice, made per
        call, not ahead) called from the op with the GIL once per new demand (plans are cached
        by demand): the debugging path through Python.
        ``"signal"`` (Algorithm 2's activations, each transfer waiting only for its sender's and
        receiver's previous activation and the last one that crossed each of its links),
        ``"barrier"`` (the paper's Algorithm 2 as it runs it) and ``"concurrent"`` (no planning;
        every pair at once) run one family each.
    network : str, NetworkModel or a sequence of them, optional
        The network model(s) ``"planned"`` and ``"model-aware"`` plan for: one (``pcie``,
        ``pcie-fair``, ``none``, a JSON file of the measured machine or a model) gives that model's fastest
        plan; several (a sequence, or names and files separated by commas) give the plan of
        least regret over them. Default: the machine is unmeasured, so ``pcie`` and ``pcie-fair``,
        with the posted-write trigger and without (the robust choice, ``ffi/choice.h``).
    transport : str, optional
        What moves the bytes: ``"memcpy"`` (the default in one process; each device's thread
        copies what it sends), ``"shm"`` (the default, and the only choice, when
        ``jax.distributed`` runs several CPU processes: POSIX shared memory between the processes
        of one host, set up here through the distributed key-value store, so every process must
        call ``configure`` with the same arguments), ``"cuda-ipc"`` (the same between GPU
        processes of one host, the rows staged in device memory and read over CUDA IPC; the
        default there where every pair of processes has peer access, which configure probes;
        builds with CUDA only), ``"cuda-host"`` (between GPU processes of one host, the rows
        bounced through pinned shared host memory; the default there without peer access; on
        CPU devices its CPU twin, copying with the emulator: for testing), ``"nccl"`` (GPU
        devices only; the default for GPU processes on several hosts: NCCL sends and receives,
        the library loaded at run time, its communicators made here through the same store, one
        per local device; every call must run on a mesh over all of ``jax.devices()``; a
        plan's steps and dependencies are kept by order, its pacing caps are not enforced) or
        ``"emulated"``, the CPU emulator of the stream executor the GPU backend shares (a thread
        per stream running its copies after random delays of up to ``emulator_delay_s``, seeded
        by ``emulator_seed``): for testing that logic.
    timeout_s : float
        Every wait of the collective gives up after this long with an error naming who is missing.
    debug : bool
        Keep the demand and the executed transfers of each call site (``last_schedule``).
    staging_budget : int, optional
        For ``shm``, ``cuda-ipc`` and ``cuda-host``: the most bytes of staging this process holds
        (device memory for cuda-ipc, pinned shared memory for cuda-host and shm), calls in
        flight and generations not yet freed together; a call that needs more fails with an
        error naming it. Default: 1/16 of this process's GPUs' memory (of the host's memory for
        CPU devices); 0: unbounded.

    Notes
    -----
    Configuring again reaches functions already jitted: the current configuration is part of
    ``jax.jit``'s cache key (``jax.make_user_context``), so a function traced under another
    configuration (or the default) is traced and compiled again on its next call and plans
    against the new one; configuring the same thing again (the same id) keeps the compiled code.
    What keeps the configuration it was built with: a call given ``config=`` explicitly, and an
    executable compiled ahead of time (``jax.jit(f).lower(...).compile()``), which runs the
    configuration it was lowered with until ``release`` frees it, after which it fails naming
    the released configuration.
    """
    if topology is None and devices is None:
        import jax

        devices = jax.device_count()
        topo = machine_topology(devices) if _on_gpus() else default_topology(devices)
    elif topology is None:
        topo = default_topology(devices)
    elif isinstance(topology, Topology):
        topo = topology if nodes is None else topology.with_nodes(nodes)
    else:
        topo = load_topology(topology, nodes)
    n = topo.num_ranks
    if topology is not None and devices is not None and devices != n:
        raise VarioPathError(
            f"configure: the topology {topo.name!r} has {n} ranks but devices={devices}; "
            f"{DETECT_HINT}"
        )
    rmap = tuple(range(n)) if rank_map is None else tuple(int(r) for r in rank_map)
    if sorted(rmap) != list(range(n)):
        raise VarioPathError(
            f"rank_map must be a permutation of the topology's {n} ranks, got {list(rmap)}"
        )
    if timeout_s <= 0:
        raise VarioPathError(f"timeout_s must be > 0, got {timeout_s}")
    process, processes = shm.processes()
    if transport is not None and transport not in TRANSPORTS:
        raise VarioPathError(f"transport must be one of {', '.join(TRANSPORTS)}, got {transport!r}")
    if transport == "nccl":  # what NCCL cannot do, before where it can run
        _nccl_limits(debug)
    if staging_budget is not None and staging_budget < 0:
        raise VarioPathError(
            f"staging_budget must be >= 0 bytes (0: unbounded), got {staging_budget}"
        )
    local = processes > 1 or transport in ("cuda-ipc", "cuda-host", "nccl")
    platform = _local_platform() if local else "cpu"
    transport, reason = choose_transport(
        transport,
        process,
        processes,
        platform,
        _native.build_info()["transports"],
        hosts=lambda: len(set(nccl.hosts(timeout_s))),
        peers=lambda: peers.choose(peers.gather(peers.local_ordinals(), timeout_s)),
    )
    if transport == "nccl":  # also when chosen as the default across hosts
        _nccl_limits(debug)
    if transport in _BETWEEN_PROCESSES and debug:
        raise VarioPathError(
            "debug=True (last_schedule) records the in-process transports' calls only, not "
            f"{transport}'s"
        )
    if not 0 <= emulator_delay_s <= timeout_s:
        raise VarioPathError(
            f"emulator_delay_s must be between 0 and the timeout, got {emulator_delay_s}"
        )
    if execution not in EXECUTIONS:
        raise VarioPathError(f"execution must be one of {', '.join(EXECUTIONS)}, got {execution!r}")
    params = params or PlannerParams()
    model = PathModel(topo, nic_policy=nic_policy)
    networks = load_networks(network)  # refuses a bad model whatever the execution
    scheduled = execution in ("planned", "model-aware")
    planner = (
        _model_aware_planner(model, params, networks, transport)
        if execution == "model-aware"
        else None
    )
    content = {
        "topology": topo.fingerprint,
        "nic_policy": nic_policy,
        "rank_map": rmap,
        "params": dataclasses.asdict(params),
        "execution": execution,
        "network": [net.to_dict() for net in networks] if scheduled else None,
        "transport": transport,
        "emulator": [emulator_seed, emulator_delay_s] if transport in _EMULATED else None,
        "timeout_s": float(timeout_s),
        "debug": bool(debug),
        "staging_budget": staging_budget,  # as asked: a default differs by process
    }
    budget = 0
    if transport in _BETWEEN_PROCESSES:
        budget = peers.default_budget(platform) if staging_budget is None else int(staging_budget)
    config = OpConfig(
        config_id(content),
        topo,
        rmap,
        params,
        execution,
        float(timeout_s),
        bool(debug),
        transport,
        reason,
        budget,
    )
    choice, models, screened = _native.ChoiceDeployment(), [], True
    # the choice plans Algorithm 2 at the first model's barrier cost, as the scheduler does
    algorithm2 = (
        dataclasses.replace(params, lambda_s=networks[0].barrier_s)
        if execution == "planned"
        else params
    )
    if n == 1:  # one device keeps its rows: nothing to plan, no catalog
        catalog_bytes, fingerprint, deployment = b"", "", _native.Deployment()
        deployment.ranks = 1
    else:
        catalog = catalog_for(model)
        catalog_bytes, fingerprint = store.dumps(catalog), catalog.fingerprint
        deployment = native_deployment(catalog, model)
        if execution == "planned":  # the choice in the C++ core: no Python on the call path
            choice = native_choice_deployment(catalog, model)[0]
            models = [native_network(net) for net in networks]
            # Algorithm 2's plans as candidates only where they win on the screen's demands, as
            # the ``variopath`` scheduler decides (NativeChooser.algorithm2_pays)
            screened = chooser_for(model, algorithm2).algorithm2_pays(tuple(networks))
    _native.register_op_config(
        config.id,
        catalog_bytes,
        fingerprint,
        deployment,
        list(rmap),
        native_params(algorithm2),
        getattr(_native.Execution, execution.upper().replace("-", "_")),
        planner,
        choice,
        models,
        getattr(_native.Transport, transport.upper().replace("-", "_")),
        int(emulator_seed),
        float(emulator_delay_s),
        config.timeout_s,
        config.debug,
        config.staging_budget,
        reason,
        screened,
    )
    if transport in (*_BETWEEN_PROCESSES, "nccl"):
        try:
            if transport == "nccl":
                nccl.bootstrap(config.id, config.timeout_s)
            else:
                shm.bootstrap(config.id, config.timeout_s, transport)
        except BaseException:
            _native.unregister_op_config(config.id)
            raise
    _make_current(config)
    return config


def _nccl_limits(debug: bool) -> None:
    """What the NCCL transport cannot do: record calls (last_schedule). (It runs every plan: a
    group of sends per step, cut before a transfer that waits for one of its own step, so every
    dependency is kept by order; pacing caps are not enforced, NCCL's sends having no rate.)"""
    if debug:
        raise VarioPathError(
            "debug=True (last_schedule) records the in-process transports' calls only, not nccl's"
        )


def _model_aware_planner(
    model: PathModel,
    params: PlannerParams,
    networks: tuple[NetworkModel, ...],
    transport: str = "memcpy",
):
    """The op's callback for ``execution="model-aware"``: demand -> ``op_plan`` of the
    ``variopath`` scheduler's schedule for ``networks`` (planned with the first one's λ), for
    ``transport`` (which refuses pulled transfers where it pushes)."""
    from variopath_jax.schedulers import PlanRequest, get_scheduler

    scheduler = get_scheduler("variopath")
    lambda_s = networks[0].barrier_s

    def plan(demand) -> dict:
        request = PlanRequest(np.asarray(demand), model, lambda_s, params.seed, network=networks)
        return op_plan(scheduler.plan(request), transport)

    return plan


def op_plan(schedule: Schedule, transport: str = "memcpy") -> dict:
    """A schedule as the op executes it: its transfers in step order (lists step_ptr, src, dst,
    bytes), each transfer's dependencies as indices into that order (its ``after`` and, for a
    barrier step, every transfer of the steps it depends on) and its pacing cap in GB/s where the
    schedule is paced (0 elsewhere: an unpaced copy runs as fast as it can). Relays are refused:
    the op moves each pair's bytes directly. So is a pulled transfer (``Transfer.pull``) where
    ``transport`` pushes (``transport_direction``): it cannot make a receiver read. A transport
    that pulls runs every transfer as a read, the pushed ones too."""
    pushes = transport_direction(transport) == "push"
    first, at = [], 0
    for st in schedule.steps:
        first.append(at)
        at += len(st.transfers)
    paced = bool(schedule.meta.get("paced"))
    out = {k: [] for k in ("src", "dst", "bytes", "after", "pace_gbs")}
    out["step_ptr"], out["after_ptr"] = [0], [0]
    for s, st in enumerate(schedule.steps):
        barrier = [
            first[d] + k
            for d in schedule.dependencies(s)
            for k in range(len(schedule.steps[d].transfers))
        ]
        for t in st.transfers:
            if t.carries != (t.src, t.dst):
                raise VarioPathError(
                    f"the op cannot execute relays: a transfer {t.src} -> {t.dst} carries {t.carries}"
                )
            if t.pull and pushes:
                raise VarioPathError(
                    f"transport {transport!r} pushes (its senders write), but the plan pulls the "
                    f"transfer {t.src} -> {t.dst} of step {s} (a read by the receiver); a pulling "
                    "transport (shm, cuda-ipc, cuda-host) runs it, or plan it as a push"
                )
            out["src"].append(t.src)
            out["dst"].append(t.dst)
            out["bytes"].append(t.nbytes)
            out["after"].extend(sorted({*barrier, *(first[a] + k for a, k in t.after)}))
            out["after_ptr"].append(len(out["after"]))
            out["pace_gbs"].append(t.rate if paced else 0.0)
        out["step_ptr"].append(len(out["src"]))
    return out


def config_id(content: dict) -> int:
    """A configuration's id: 63 bits of a hash of what it is (never 0)."""
    digest = hashlib.blake2b(json.dumps(content, sort_keys=True).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1 or 1


def release(config: OpConfig) -> None:
    """Free a configuration's planner; calls compiled against it fail with a clear error after.
    The process's current configuration is released too when it is this one."""
    _native.unregister_op_config(config.id)
    shm.release(config.id)
    nccl.release(config.id)
    with _lock:
        current = _current
    if current is not None and current.id == config.id:
        _make_current(None)
    with _lock:
        for devices, cfg in list(_defaults.items()):
            if cfg.id == config.id:
                del _defaults[devices]


def current_config(devices: int) -> OpConfig:
    """The configured topology, or the default for ``devices`` (built once per size)."""
    with _lock:
        config = _current
    if config is not None:
        return config
    if devices not in _defaults:
        cfg = configure(machine_topology(devices)) if _on_gpus() else configure(devices=devices)
        _make_current(None)  # a default does not become the process-wide configuration
        _defaults[devices] = cfg
    return _defaults[devices]
