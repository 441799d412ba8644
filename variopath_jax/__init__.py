"""variopath_jax: topology- and demand-aware AlltoAllv for PCIe GPU clusters (VarioPath).

The JAX op (``all_to_all_v``, ``ragged_all_to_all``, ``configure``) is imported on first use, so
the topology, catalog, planner and simulator layers load without JAX.
"""

from __future__ import annotations

from typing import Any

from variopath_jax.errors import ParseError, TopologyError, VarioPathError
from variopath_jax.topology import PathModel, Topology, load_topology, preset

__version__ = "0.1.0"

_JAX_API = (
    "all_to_all_v",
    "ragged_all_to_all",
    "configure",
    "last_schedule",
    "OpConfig",
    "MoEDispatch",
    "RoutingHandle",
    "moe_dispatch",
    "moe_combine",
    "moe_dispatch_rows",
    "moe_combine_rows",
)

__all__ = [
    "MoEDispatch",
    "OpConfig",
    "ParseError",
    "PathModel",
    "RoutingHandle",
    "Topology",
    "TopologyError",
    "VarioPathError",
    "all_to_all_v",
    "configure",
    "last_schedule",
    "load_topology",
    "moe_combine",
    "moe_combine_rows",
    "moe_dispatch",
    "moe_dispatch_rows",
    "preset",
    "ragged_all_to_all",
]


def __getattr__(name: str) -> Any:
    if name in _JAX_API:
        from variopath_jax import jax_ops

        return getattr(jax_ops, name)
    raise AttributeError(f"module 'variopath_jax' has no attribute {name!r}")
