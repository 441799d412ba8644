"""Peer schedulers in the schedule IR; importing this package registers them."""

from variopath_jax.baselines import nccl, pairwise

__all__ = ["nccl", "pairwise"]
