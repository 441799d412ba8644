"""An expert-parallel MoE block on ``moe_dispatch`` / ``jax.lax.ragged_dot`` / ``moe_combine``.

``moe_block`` runs inside ``shard_map``: each device holds its tokens and the experts of its
position on the expert axis (a mesh axis name, or a tuple of them: the ranks are their linear
index in mesh order). The router scores every expert, each token picks its ``top_k`` experts
(gates: the softmax of the picked logits, as Mixtral and Qwen3-MoE do), the token slots are
sorted by expert (so grouped by destination device, then by its local expert), dispatched, run
through a grouped two-matrix FFN (``ragged_dot`` over the received rows grouped by local
expert) and combined back to the slots they came from, weighted by their gates.

Dropless by default: the receive buffer holds the worst case (every slot of every device on one
device), so nothing is dropped. ``capacity`` bounds it instead (capacity mode): a device keeps
the first ``capacity`` rows it receives, in source-rank order (``moe_dispatch``'s rule), and a
dropped slot contributes nothing (GShard's token dropping: Lepikhin et al., 2020,
arXiv:2006.16668).

``moe_reference`` is the dense single-device reference: every token through every expert,
keeping its top-k outputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from variopath_jax.errors import VarioPathError
from variopath_jax.jax_ops.config import OpConfig
from variopath_jax.jax_ops.moe import moe_combine, moe_dispatch


@partial(jax.tree_util.register_dataclass, data_fields=["router", "w1", "w2"], meta_fields=[])
@dataclass(frozen=True)
class MoEParams:
    """The block's weights: ``router`` (D, E) replicated; ``w1`` (E, D, F) and ``w2`` (E, F, D)
    the experts (inside ``shard_map``: this device's E_local of them)."""

    router: jax.Array
    w1: jax.Array
    w2: jax.Array


@partial(
    jax.tree_util.register_dataclass,
    data_fields=["send_counts", "dropped", "kept"],
    meta_fields=[],
)
@dataclass(frozen=True)
class MoEStats:
    """What one device's block exchanged: ``send_counts`` (N, E_local) slots sent to each
    (device, local expert); ``dropped`` (N,) slots from each source dropped here (capacity mode);
    ``kept`` (T, top_k) whether each of this device's slots reached its expert."""

    send_counts: jax.Array
    dropped: jax.Array
    kept: jax.Array


def init_moe(
    seed: int, d_model: int, d_ff: int, experts: int, dtype: jnp.dtype = jnp.float32
) -> MoEParams:
    """Seeded weights for all ``experts`` (shard ``w1``/``w2`` over the expert axis)."""
    rng = np.random.default_rng(seed)
    router = rng.standard_normal((d_model, experts)) / np.sqrt(d_model)
    w1 = rng.standard_normal((experts, d_model, d_ff)) / np.sqrt(d_model)
    w2 = rng.standard_normal((experts, d_ff, d_model)) / np.sqrt(d_ff)
    return MoEParams(*(jnp.asarray(a, dtype) for a in (router, w1, w2)))


def route(x: jax.Array, router: jax.Array, top_k: int) -> tuple[jax.Array, jax.Array]:
    """Each token's ``top_k`` experts (int32 (T, k)) and their gates (softmax of their logits)."""
    experts = router.shape[-1]
    if (
        isinstance(top_k, bool)
        or not isinstance(top_k, int | np.integer)
        or not (1 <= top_k <= experts)
    ):
        raise VarioPathError(
            f"top_k must be a whole number of experts per token in [1, {experts}] (the router "
            f"scores {experts}), got {top_k!r}"
        )
    logits, ids = jax.lax.top_k(x @ router, top_k)
    return ids.astype(jnp.int32), jax.nn.softmax(logits.astype(jnp.float32), axis=-1).astype(
        x.dtype
    )


def _expert_ffn(rows: jax.Array, w1: jax.Array, w2: jax.Array, sizes: jax.Array) -> jax.Array:
    """The grouped FFN: rows grouped by local expert through that expert's matrices."""
    return jax.lax.ragged_dot(jax.nn.gelu(jax.lax.ragged_dot(rows, w1, sizes)), w2, sizes)


def moe_block(
    x: jax.Array,
    params: MoEParams,
    *,
    axis_name,
    top_k: int,
    capacity: int | None = None,
    config: OpConfig | None = None,
) -> tuple[jax.Array, MoEStats]:
    """One device's MoE block inside ``shard_map``: ``x`` (T, D) its tokens, ``params`` with its
    local experts (``w1`` (E_local, D, F)); returns (T, D) and what was exchanged.

    ``axis_name``: the expert axis (or axes); ``capacity``: rows each device receives at most
    (default: dropless, the worst case N·T·top_k); ``config``: the op's configuration (its ranks
    must equal the expert axis size)."""
    if x.ndim != 2:
        raise VarioPathError(f"moe_block: x must be (tokens, d_model), got shape {x.shape}")
    n = int(jax.lax.axis_size(axis_name))
    local = params.w1.shape[0]
    experts = params.router.shape[1]
    if experts != n * local:
        raise VarioPathError(
            f"moe_block: the router scores {experts} experts but the expert axis has {n} devices "
            f"of {local} local experts each"
        )
    tokens = x.shape[0]
    ids, gates = route(x, params.router, top_k)
    flat = ids.reshape(-1)
    order = jnp.argsort(flat, stable=True)  # slots grouped by destination, then local expert
    counts = jnp.bincount(flat, length=experts).reshape(n, local).astype(jnp.int32)
    dropless = capacity is None
    cap = n * tokens * top_k if dropless else int(capacity)
    d = moe_dispatch(
        x[order // top_k],
        counts,
        axis_name=axis_name,
        out_capacity=cap,
        drop_overflow=not dropless,
        config=config,
    )
    y = moe_combine(_expert_ffn(d.rows, params.w1, params.w2, d.group_sizes), d)
    y = jnp.zeros_like(y).at[order].set(y)  # back to (token, slot) order
    kept = jnp.zeros_like(d.kept).at[order].set(d.kept).reshape(tokens, top_k)
    out = (y.reshape(tokens, top_k, -1) * gates[..., None]).sum(axis=1)
    return out, MoEStats(counts, d.dropped, kept)


def moe_reference(
    x: jax.Array, params: MoEParams, *, top_k: int, kept: jax.Array | None = None
) -> jax.Array:
    """The dense reference on one device: ``x`` (M, D) through all experts, each token keeping its
    top-k outputs weighted by their gates (``kept`` (M, top_k): drop the slots it marks False)."""
    ids, gates = route(x, params.router, top_k)
    h = jax.nn.gelu(jnp.einsum("md,edf->mef", x, params.w1))
    y = jnp.einsum("mef,efd->med", h, params.w2)
    picked = jnp.take_along_axis(y, ids[..., None], axis=1)
    if kept is not None:
        gates = jnp.where(kept, gates, 0)
    return (picked * gates[..., None]).sum(axis=1)
