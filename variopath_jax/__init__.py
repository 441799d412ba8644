"""variopath_jax: topology- and demand-aware AlltoAllv for PCIe GPU clusters (VarioPath).

The topology layer (:mod:`variopath_jax.topology`) is importable without touching JAX.
"""

from __future__ import annotations

from variopath_jax.errors import ParseError, TopologyError, VarioPathError
from variopath_jax.topology import PathModel, Topology, load_topology, preset

__version__ = "0.1.0"

__all__ = [
    "ParseError",
    "PathModel",
    "Topology",
    "TopologyError",
    "VarioPathError",
    "load_topology",
    "preset",
]
