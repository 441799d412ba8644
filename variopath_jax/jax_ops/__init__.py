"""The JAX op: ``all_to_all_v`` and a ``ragged_all_to_all`` drop-in over XLA FFI (CPU devices;
CUDA devices of one process where the CUDA parts were built)."""

import atexit

from variopath_jax._native import quiesce_handlers as _quiesce_handlers
from variopath_jax._native import registrations as _registrations
from variopath_jax.jax_ops._compat import register_targets
from variopath_jax.jax_ops.config import (
    OpConfig,
    configure,
    current_config,
    default_topology,
    release,
)
from variopath_jax.jax_ops.moe import (
    MoEDispatch,
    RoutingHandle,
    moe_combine,
    moe_combine_rows,
    moe_dispatch,
    moe_dispatch_rows,
    receive_capacity,
)
from variopath_jax.jax_ops.ops import all_to_all_v, last_schedule, ragged_all_to_all

register_targets(_registrations("cpu"), "cpu")
register_targets(_registrations("cuda"), "CUDA")  # empty in a build without CUDA
# At interpreter exit no collective of ours may still run on the CPU handlers' threads while JAX's
# runtime is torn down: the calls in flight fail at once and their threads end (waiting at most
# 10 s). atexit runs this before jax's own handlers, which were registered first.
atexit.register(_quiesce_handlers, 10.0)

__all__ = [
    "MoEDispatch",
    "OpConfig",
    "RoutingHandle",
    "all_to_all_v",
    "configure",
    "current_config",
    "default_topology",
    "last_schedule",
    "moe_combine",
    "moe_combine_rows",
    "moe_dispatch",
    "moe_dispatch_rows",
    "ragged_all_to_all",
    "receive_capacity",
    "release",
]
