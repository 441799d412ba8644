"""Online planner: channel-guided demand decomposition (paper §4.2, Algorithm 2).

Importing this package registers the schedulers ``variopath-paper``, ``variopath``,
``variopath-robust``, ``op``, ``variopath-fixed-path`` and ``variopath-fixed-peer``; the choice
itself is the C++ core's (``planner/native.py``, ``ffi/choice.h``).
"""

from variopath_jax.planner import schedulers
from variopath_jax.planner.reference import PlannerParams, ReferencePlanner, endpoint_time_s

__all__ = ["PlannerParams", "ReferencePlanner", "endpoint_time_s", "schedulers"]
