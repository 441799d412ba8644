"""The shared-memory transport's bootstrap, at configuration time (issue 16, "Several processes").

Every process of a ``jax.distributed`` run calls ``configure`` with the same arguments, so each
derives the same configuration id. ``bootstrap`` then, once per configuration and never per
call, goes through the distributed key-value store: every process publishes its host; process 0
creates the control segment (ffi/shm_transport.h) and publishes its name; the others attach to
it; after a barrier every process checks that it sees all the others and process 0 removes the
segment's name (the mappings stay), so that nothing of it is left in /dev/shm whatever happens.
Then every process probes whether it may read the others' memory (cross-memory attach,
ffi/cma.h; ``VARIOPATH_SHM_CMA=0`` skips it), and after a second barrier all agree: receivers
read the rows sent to them straight out of the senders' buffers where every process can, else
from the senders' staging. The cuda-ipc and cuda-host transports (GPU processes of one host) are
bootstrapped the same way and run on the same control segment.
"""

from __future__ import annotations

import atexit
import itertools
import os
import socket

from variopath_jax import _native
from variopath_jax.errors import VarioPathError
from variopath_jax.jax_ops import _compat

_rounds: dict[int, itertools.count] = {}  # configuration id -> how many times it was bootstrapped


def processes() -> tuple[int, int]:
    """``(process index, process count)`` of this ``jax.distributed`` run ((0, 1) without one)."""
    dist = _compat.distributed_client()
    return (0, 1) if dist is None else (dist[1], dist[2])


def bootstrap(config_id: int, timeout_s: float, transport: str = "shm") -> None:
    """Set up configuration ``config_id``'s shared-memory transport in this process, with its
    peers (every process of the run calls this, in the same order of configurations); the
    ``cuda-ipc`` and ``cuda-host`` transports run on the same control segment."""
    dist = _compat.distributed_client()
    cross_memory = os.environ.get("VARIOPATH_SHM_CMA", "1") != "0"
    if dist is None:  # one process: the transport works all the same, between its own devices
        _native.shm_create(config_id, 1, timeout_s)
        _native.shm_ready(config_id, cross_memory)
        _native.shm_agree(config_id)
        return
    client, me, count = dist
    base = f"variopath_jax/shm/{config_id}/{next(_rounds.setdefault(config_id, itertools.count()))}"
    timeout_ms = max(1, int(timeout_s * 1000))

    def get(key: str, what: str) -> str:
        try:
            return client.blocking_key_value_get(f"{base}/{key}", timeout_ms)
        except Exception as err:  # the store names its own failure (deadline, shutdown)
            raise VarioPathError(
                f"configure: process {me} waited {timeout_s:g} s for {what} through the "
                f"jax.distributed key-value store: {err}"
            ) from err

    host = socket.gethostname()
    client.key_value_set(f"{base}/host/{me}", host)
    hosts = [host if p == me else get(f"host/{p}", f"process {p}'s host") for p in range(count)]
    if len(set(hosts)) > 1:
        where = ", ".join(f"process {p} on {h}" for p, h in enumerate(hosts))
        raise VarioPathError(
            f"configure: the processes run on more than one host ({where}); the {transport} "
            "transport connects processes of one host only"
            + (
                "; between GPU processes on several hosts use transport='nccl'"
                if transport in ("cuda-ipc", "cuda-host")
                else ""
            )
        )
    try:
        if me == 0:
            client.key_value_set(f"{base}/control", _native.shm_create(config_id, count, timeout_s))
        else:
            _native.shm_attach(config_id, get("control", "process 0's control segment"), me, count)
        client.key_value_set(f"{base}/attached/{me}", "1")
        for p in range(count):
            if p != me:
                get(f"attached/{p}", f"process {p} to attach")
        _native.shm_ready(config_id, cross_memory)
        client.key_value_set(f"{base}/ready/{me}", "1")
        for p in range(count):
            if p != me:
                get(f"ready/{p}", f"process {p} to probe cross-memory attach")
        _native.shm_agree(config_id)
    except (RuntimeError, ValueError) as err:
        _native.shm_release(config_id)
        raise VarioPathError(f"configure: the {transport} transport: {err}") from err
    except BaseException:
        _native.shm_release(config_id)
        raise


def release(config_id: int) -> None:
    """Leave a configuration's transport: its peers' calls fail naming this process, and this
    process's segments go."""
    _native.shm_release(config_id)


atexit.register(_native.shm_release_all)
