"""Peer schedulers in the schedule IR; importing this package registers them."""

from variopath_jax.baselines import deepep, fast, msccl, nccl, pairwise, railwave

__all__ = ["deepep", "fast", "msccl", "nccl", "pairwise", "railwave"]
