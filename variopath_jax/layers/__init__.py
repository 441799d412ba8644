"""Layers on the VarioPath op, for use inside ``shard_map``: an expert-parallel MoE block
(``moe``) and Ulysses sequence-parallel attention with uneven per-device lengths (``ulysses``),
each with a dense single-device reference."""

from variopath_jax.layers.moe import MoEParams, MoEStats, init_moe, moe_block, moe_reference
from variopath_jax.layers.ulysses import (
    AttentionParams,
    attention_reference,
    init_attention,
    ulysses_attention,
)

__all__ = [
    "AttentionParams",
    "MoEParams",
    "MoEStats",
    "attention_reference",
    "init_attention",
    "init_moe",
    "moe_block",
    "moe_reference",
    "ulysses_attention",
]
