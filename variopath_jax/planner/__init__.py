"""Online planner: channel-guided demand decomposition (paper §4.2, Algorithm 2)."""

from variopath_jax.planner.reference import PlannerParams, ReferencePlanner, endpoint_time_s

__all__ = ["PlannerParams", "ReferencePlanner", "endpoint_time_s"]
