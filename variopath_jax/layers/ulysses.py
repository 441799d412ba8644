"""Ulysses sequence-parallel attention on ``all_to_all_v``, with uneven per-device lengths.

DeepSpeed-Ulysses (Jacobs et al., 2023, arXiv:2309.14509) shards a sequence over P devices and
turns sequence sharding into head sharding for the attention itself: an all-to-all sends each
device's tokens of head group j to device j, which then holds the whole sequence for H/P heads,
attends, and a second all-to-all returns each device its tokens, all heads. Here each device's
chunk has its own length (variable-length packing gives uneven chunks), held in a buffer of L
rows, so the exchanges are AlltoAllv: device r sends ``length_r`` rows to every device, and the
way back device j sends each device r its ``length_r`` rows. The sequence is the concatenation of
the devices' valid rows in axis order; ``segment_ids`` keep packed documents apart (attention
within one segment only) and ``causal`` masks the future.

Everything runs inside ``shard_map`` over the sequence axis (a mesh axis name or a tuple of them;
any other mesh axis, e.g. data, is independent). ``attention_reference`` is the dense
single-device reference over the concatenated sequence.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from variopath_jax.errors import VarioPathError
from variopath_jax.jax_ops.config import OpConfig
from variopath_jax.jax_ops.ops import all_to_all_v

_MASKED = -1e30  # a masked score: finite, so a fully masked (padding) query stays finite


@partial(jax.tree_util.register_dataclass, data_fields=["wq", "wk", "wv", "wo"], meta_fields=[])
@dataclass(frozen=True)
class AttentionParams:
    """Projections, replicated: ``wq``, ``wk``, ``wv`` (D, H·Dh) and ``wo`` (H·Dh, D)."""

    wq: jax.Array
    wk: jax.Array
    wv: jax.Array
    wo: jax.Array


def init_attention(
    seed: int, d_model: int, heads: int, head_dim: int, dtype: jnp.dtype = jnp.float32
) -> AttentionParams:
    """Seeded projections."""
    rng = np.random.default_rng(seed)
    inner = heads * head_dim
    mats = [rng.standard_normal((d_model, inner)) / np.sqrt(d_model) for _ in range(3)]
    mats.append(rng.standard_normal((inner, d_model)) / np.sqrt(inner))
    return AttentionParams(*(jnp.asarray(m, dtype) for m in mats))


def _attend(q, k, v, q_pos, k_pos, q_seg, k_seg, valid_q, valid_k, causal: bool) -> jax.Array:
    """Softmax attention (Q, H, Dh) x (K, H, Dh) -> (Q, H, Dh); masked: padding, other
    segments, and with ``causal`` later positions; a query with nothing to attend gives zeros."""
    scale = 1.0 / np.sqrt(q.shape[-1])
    scores = jnp.einsum("qhd,khd->hqk", q, k) * scale
    mask = valid_q[:, None] & valid_k[None, :] & (q_seg[:, None] == k_seg[None, :])
    if causal:
        mask &= k_pos[None, :] <= q_pos[:, None]
    scores = jnp.where(mask[None], scores, _MASKED)
    weights = jax.nn.softmax(scores, axis=-1) * mask[None]
    return jnp.einsum("hqk,khd->qhd", weights, v)


def ulysses_attention(
    x: jax.Array,
    length: jax.Array,
    params: AttentionParams,
    *,
    axis_name,
    heads: int,
    segment_ids: jax.Array | None = None,
    causal: bool = True,
    config: OpConfig | None = None,
) -> jax.Array:
    """One device's attention inside ``shard_map``: ``x`` (L, D) its chunk of the sequence, of
    which the first ``length`` rows (an int scalar or shape-(1,) array) are tokens; returns
    (L, D), zeros past ``length``. ``heads`` must be a multiple of the sequence axis size;
    ``segment_ids`` (L,) int: packed documents (default: one); ``config``: the op's
    configuration (its ranks must equal the axis size)."""
    if x.ndim != 2:
        raise VarioPathError(f"ulysses_attention: x must be (rows, d_model), got {x.shape}")
    p = int(jax.lax.axis_size(axis_name))
    if heads % p:
        raise VarioPathError(
            f"ulysses_attention: {heads} heads do not split over the {p} devices of the "
            "sequence axis (Ulysses needs heads to be a multiple of them)"
        )
    rows = x.shape[0]
    inner = params.wq.shape[1]
    if inner % heads:
        raise VarioPathError(f"ulysses_attention: width {inner} is not {heads} heads")
    head_dim, local = inner // heads, heads // p
    n = jnp.clip(jnp.asarray(length, jnp.int32).reshape(()), 0, rows)
    seg = jnp.zeros(rows, jnp.int32) if segment_ids is None else segment_ids.astype(jnp.int32)
    # sequence -> heads: row t of head group j goes to device j; rows grouped by destination
    qkv = jnp.stack([x @ params.wq, x @ params.wk, x @ params.wv], axis=1)  # (L, 3, H·Dh)
    qkv = qkv.reshape(rows, 3, p, local * head_dim).transpose(2, 0, 1, 3).reshape(p * rows, -1)
    pos = jnp.arange(p * rows, dtype=jnp.int32)
    per = jnp.maximum(n, 1)
    send_at = jnp.where(pos < p * n, (pos // per) * rows + pos % per, p * rows)
    send = jnp.take(qkv, send_at, axis=0, mode="fill", fill_value=0)
    recv, _ = all_to_all_v(
        send, jnp.full((p,), n), axis_name=axis_name, out_capacity=p * rows, config=config
    )
    # the whole sequence (its rows from each device in axis order) for this device's heads
    lengths = jax.lax.all_gather(n, axis_name)  # (P,)
    starts = jnp.cumsum(lengths) - lengths
    total = lengths.sum()
    src = jnp.clip(jnp.searchsorted(jnp.cumsum(lengths), pos, side="right"), 0, p - 1)
    gseg = jax.lax.all_gather(seg, axis_name)[src, jnp.clip(pos - starts[src], 0, rows - 1)]
    valid = pos < total
    q, k, v = (a.reshape(p * rows, local, head_dim) for a in jnp.split(recv, 3, axis=1))
    out = _attend(q, k, v, pos, pos, gseg, gseg, valid, valid, causal)
    # heads -> sequence: device r's rows go back to it (they are contiguous, in order)
    back, _ = all_to_all_v(
        out.reshape(p * rows, local * head_dim),
        lengths,
        axis_name=axis_name,
        out_capacity=p * rows,
        config=config,
    )
    # back holds, per head group j, this device's n rows: row t of group j at j·n + t
    t = jnp.arange(rows, dtype=jnp.int32)
    at = jnp.where(
        t[:, None] < n, jnp.arange(p, dtype=jnp.int32)[None, :] * n + t[:, None], p * rows
    )
    mine = jnp.take(back, at.reshape(-1), axis=0, mode="fill", fill_value=0)
    return mine.reshape(rows, inner) @ params.wo


def attention_reference(
    x: jax.Array,
    params: AttentionParams,
    *,
    heads: int,
    segment_ids: jax.Array | None = None,
    causal: bool = True,
) -> jax.Array:
    """The dense reference on one device: ``x`` (S, D) the whole sequence."""
    s = x.shape[0]
    inner = params.wq.shape[1]
    q, k, v = ((x @ w).reshape(s, heads, inner // heads) for w in (params.wq, params.wk, params.wv))
    pos = jnp.arange(s, dtype=jnp.int32)
    seg = jnp.zeros(s, jnp.int32) if segment_ids is None else jnp.asarray(segment_ids, jnp.int32)
    ok = jnp.ones(s, bool)
    return _attend(q, k, v, pos, pos, seg, seg, ok, ok, causal).reshape(s, inner) @ params.wo
