"""The NCCL transport's bootstrap, at configuration time (issue 16, "Several processes": GPU
processes on different nodes; ffi/nccl/nccl_collective.h).

NCCL is loaded at run time (ffi/nccl/loader.h) from ``$VARIOPATH_NCCL_LIBRARY`` if set, else
from the ``nvidia-nccl-cu13`` or ``nvidia-nccl-cu12`` wheel (``nvidia/nccl/lib/libnccl.so.2``),
else by the dynamic loader's default search for ``libnccl.so.2``. ``bootstrap`` runs once per
configuration, never per call: process 0 makes the unique id and shares it through the
``jax.distributed`` key-value store, and every process makes one communicator per local device,
whose rank is the device's index in ``jax.devices()``; a process that never arrives makes the
others fail within the timeout.
"""

from __future__ import annotations

import importlib.util
import itertools
import os
import socket
from pathlib import Path

from variopath_jax import _native
from variopath_jax.errors import VarioPathError
from variopath_jax.jax_ops import _compat

ENV = "VARIOPATH_NCCL_LIBRARY"
_rounds: dict[int, itertools.count] = {}  # configuration id -> how many times it was bootstrapped
_host_rounds = (
    itertools.count()
)  # configure() calls that asked for the hosts (same order everywhere)


def library_path() -> str:
    """Where NCCL is loaded from: ``$VARIOPATH_NCCL_LIBRARY``, else the NCCL wheel's library, else
    ``""`` (the dynamic loader's default search for ``libnccl.so.2``)."""
    env = os.environ.get(ENV)
    if env:
        return env
    try:
        spec = importlib.util.find_spec("nvidia.nccl")
    except (ImportError, ValueError):  # no nvidia namespace package at all
        spec = None
    for base in (spec.submodule_search_locations or ()) if spec is not None else ():
        lib = Path(base) / "lib" / "libnccl.so.2"
        if lib.exists():
            return str(lib)
    return ""


def load() -> dict:
    """Load NCCL: ``{"version": "2.x.y", "path": ...}``; VarioPathError naming the library (and
    the missing symbol or the version found) when it cannot be used."""
    path = library_path()
    try:
        return _native.nccl_library(path)
    except RuntimeError as err:
        source = f" (from ${ENV})" if os.environ.get(ENV) else ""
        raise VarioPathError(f"the NCCL transport{source}: {err}") from err


def library_info() -> dict:
    """What ``variopath info --json`` reports under ``nccl``: the version and path of the
    library, or the reason it does not load (``error``)."""
    try:
        return {**load(), "error": None}
    except VarioPathError as err:
        return {"version": None, "path": library_path() or None, "error": str(err)}


def built() -> bool:
    """Whether this build has the NCCL transport (it needs the CUDA parts)."""
    return "nccl" in _native.build_info()["transports"]


def hosts(timeout_s: float) -> list[str]:
    """The host of every process of this ``jax.distributed`` run, by process index (one
    key-value round; every process calls it, in the same order)."""
    dist = _compat.distributed_client()
    if dist is None:
        return [socket.gethostname()]
    client, me, count = dist
    base = f"variopath_jax/hosts/{next(_host_rounds)}"
    client.key_value_set(f"{base}/{me}", socket.gethostname())
    return [
        kv_get(client, f"{base}/{p}", timeout_s, me, f"process {p}'s host") for p in range(count)
    ]


def kv_get(client, key: str, timeout_s: float, me: int, what: str) -> str:
    """The value of ``key`` in the key-value store, waited for at most ``timeout_s`` (an error
    naming process ``me`` and ``what`` it waited for)."""
    try:
        return client.blocking_key_value_get(key, max(1, int(timeout_s * 1000)))
    except Exception as err:  # the store names its own failure (deadline, shutdown)
        raise VarioPathError(
            f"configure: process {me} waited {timeout_s:g} s for {what} through the "
            f"jax.distributed key-value store: {err}"
        ) from err


def bootstrap(config_id: int, timeout_s: float) -> None:
    """Make configuration ``config_id``'s communicators in this process, with its peers (every
    process of the run calls this, in the same order of configurations)."""
    import jax

    if not built():
        raise VarioPathError(
            "transport 'nccl' needs the CUDA parts, but variopath_jax was built without a CUDA compiler"
        )
    library = load()["path"]
    devices = jax.devices()
    local = jax.local_devices()
    ranks = [devices.index(d) for d in local]
    ordinals = [
        d.local_hardware_id if d.local_hardware_id is not None else i for i, d in enumerate(local)
    ]
    dist = _compat.distributed_client()
    if dist is None:
        uid = _native.nccl_unique_id(library)
    else:
        client, me, _ = dist
        key = f"variopath_jax/nccl/{config_id}/{next(_rounds.setdefault(config_id, itertools.count()))}"
        if me == 0:
            uid = _native.nccl_unique_id(library)
            client.key_value_set(f"{key}/id", uid.hex())
        else:
            uid = bytes.fromhex(kv_get(client, f"{key}/id", timeout_s, me, "process 0's NCCL id"))
    try:
        _native.nccl_init(config_id, library, uid, len(devices), ranks, ordinals, timeout_s)
    except RuntimeError as err:
        raise VarioPathError(f"configure: the NCCL transport: {err}") from err


def release(config_id: int) -> None:
    """Free a configuration's communicators (none in a build without the CUDA parts)."""
    if hasattr(_native, "nccl_release"):
        _native.nccl_release(config_id)
