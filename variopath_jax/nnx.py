"""Flax NNX modules for the layers: ``MoEBlock`` (``variopath_jax.layers.moe_block``) and
``UlyssesAttention`` (``variopath_jax.layers.ulysses_attention``).

Each module holds its weights whole (``nnx.Param``) and runs its layer in a ``shard_map`` over the
mesh it was built with, so it is called on global arrays, under ``nnx.jit`` / ``nnx.grad`` or
plain ``jax.jit``, like any other NNX module. Needs flax: ``pip install 'variopath_jax[flax]'``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

try:
    from flax import nnx
except ImportError as e:  # pragma: no cover - flax is an optional extra
    raise ImportError(
        "variopath_jax.nnx needs flax: pip install 'variopath_jax[flax]' (or pip install flax)"
    ) from e

from variopath_jax.errors import VarioPathError
from variopath_jax.jax_ops.config import OpConfig
from variopath_jax.layers.moe import MoEParams, moe_block
from variopath_jax.layers.ulysses import AttentionParams, ulysses_attention


def _names(axes) -> tuple[str, ...]:
    if axes is None:
        return ()
    return tuple(axes) if isinstance(axes, (tuple, list)) else (axes,)


def _place(mesh: jax.sharding.Mesh, tree, specs):
    """``tree`` laid out by ``specs`` on ``mesh``: resharded on a mesh of explicit axes (which
    ``shard_map`` requires), constrained on one of automatic axes."""
    explicit = any(t == jax.sharding.AxisType.Explicit for t in mesh.axis_types)

    def one(a, spec):
        sharding = NamedSharding(mesh, spec)
        if explicit:
            return jax.reshard(a, sharding)
        return jax.lax.with_sharding_constraint(a, sharding)

    return jax.tree.map(one, tree, specs)


def _normal(rngs: nnx.Rngs, shape: tuple[int, ...], fan_in: int, dtype) -> jax.Array:
    return (jax.random.normal(rngs.params(), shape, jnp.float32) / jnp.sqrt(fan_in)).astype(dtype)


@partial(
    jax.tree_util.register_dataclass,
    data_fields=["aux_loss", "z_loss", "dropped_slots"],
    meta_fields=[],
)
@dataclass(frozen=True)
class MoEAux:
    """``MoEBlock``'s second result: the load-balancing loss and router z-loss (means over the
    expert groups of the data axis) and the (token, expert) slots dropped in all."""

    aux_loss: jax.Array
    z_loss: jax.Array
    dropped_slots: jax.Array


class MoEBlock(nnx.Module):
    """An expert-parallel MoE block (``moe_block``) over ``mesh``.

    The router (D, E) and shared experts are replicated; the experts ``w1`` (E, D, F) and ``w2``
    (E, F, D) are sharded over ``expert_axis`` (a mesh axis or a tuple of them, N devices; E a
    multiple of N). Called on tokens (M, ..., D) whose leading axis is sharded over
    ``data_axis`` (if any) then ``expert_axis``; returns (M, ..., D) and ``MoEAux``. The other
    keywords are ``moe_block``'s (default: a receive buffer of 1.25 × tokens × top_k rows).
    """

    def __init__(
        self,
        d_model: int,
        d_ff: int,
        num_experts: int,
        *,
        top_k: int,
        mesh: jax.sharding.Mesh,
        expert_axis,
        data_axis=None,
        shared_ff: int = 0,
        capacity_factor: float | None = None,
        capacity: int | None = None,
        dropless: bool = False,
        chunk_rows: int | None = None,
        config: OpConfig | None = None,
        rngs: nnx.Rngs,
        dtype=jnp.float32,
    ):
        n = 1
        for a in _names(expert_axis):
            n *= mesh.shape[a]
        if num_experts % n:
            raise VarioPathError(
                f"MoEBlock: {num_experts} experts do not split over the {n} devices of the "
                f"expert axis {expert_axis!r}"
            )
        self.router = nnx.Param(_normal(rngs, (d_model, num_experts), d_model, dtype))
        self.w1 = nnx.Param(_normal(rngs, (num_experts, d_model, d_ff), d_model, dtype))
        self.w2 = nnx.Param(_normal(rngs, (num_experts, d_ff, d_model), d_ff, dtype))
        if shared_ff > 0:
            self.shared_w1 = nnx.Param(_normal(rngs, (d_model, shared_ff), d_model, dtype))
            self.shared_w2 = nnx.Param(_normal(rngs, (shared_ff, d_model), shared_ff, dtype))
        else:
            self.shared_w1 = self.shared_w2 = None
        self.top_k = top_k
        self.mesh = mesh
        self.expert_axis = expert_axis
        self.data_axis = data_axis
        self.options = {
            "capacity_factor": capacity_factor,
            "capacity": capacity,
            "dropless": dropless,
            "chunk_rows": chunk_rows,
            "config": config,
        }

    def params(self) -> MoEParams:
        """The weights as ``moe_block`` takes them (whole, not sharded)."""
        shared = (None, None)
        if self.shared_w1 is not None:
            shared = (self.shared_w1[...], self.shared_w2[...])
        return MoEParams(self.router[...], self.w1[...], self.w2[...], *shared)

    def __call__(self, x: jax.Array) -> tuple[jax.Array, MoEAux]:
        data, experts = _names(self.data_axis), _names(self.expert_axis)
        tokens = P(data + experts)
        espec = P(self.expert_axis)
        params = self.params()
        shared = (P(), P()) if params.shared_w1 is not None else ()
        pspec = MoEParams(P(), espec, espec, *shared)

        def body(xb, pb):
            y, st = moe_block(xb, pb, axis_name=self.expert_axis, top_k=self.top_k, **self.options)
            aux, z = st.aux_loss, st.z_loss
            if data:
                aux, z = jax.lax.pmean((aux, z), data)
            dropped = jax.lax.psum(st.dropped_slots, data + experts)
            return y, MoEAux(aux, z, dropped)

        f = jax.shard_map(
            body,
            mesh=self.mesh,
            in_specs=(tokens, pspec),
            out_specs=(tokens, MoEAux(P(), P(), P())),
        )
        return f(*_place(self.mesh, (x, params), (tokens, pspec)))


class UlyssesAttention(nnx.Module):
    """Ulysses sequence-parallel attention (``ulysses_attention``) over ``mesh``, with uneven
    per-device lengths.

    Called on ``x`` (B, N·L, D): B sequences (sharded over ``data_axis``, if any), each in N
    chunks of L rows, chunk r on device r of ``seq_axis`` (N devices; ``heads`` a multiple of
    N); ``lengths`` (B, N) int the valid rows of each chunk (a sequence is its chunks' valid rows
    in order); ``segment_ids`` (B, N·L) int, optional: packed documents. Returns (B, N·L, D),
    zeros past each chunk's length.
    """

    def __init__(
        self,
        d_model: int,
        heads: int,
        head_dim: int,
        *,
        mesh: jax.sharding.Mesh,
        seq_axis,
        data_axis=None,
        causal: bool = True,
        config: OpConfig | None = None,
        rngs: nnx.Rngs,
        dtype=jnp.float32,
    ):
        inner = heads * head_dim
        self.wq, self.wk, self.wv = (
            nnx.Param(_normal(rngs, (d_model, inner), d_model, dtype)) for _ in range(3)
        )
        self.wo = nnx.Param(_normal(rngs, (inner, d_model), inner, dtype))
        self.heads = heads
        self.mesh = mesh
        self.seq_axis = seq_axis
        self.data_axis = data_axis
        self.causal = causal
        self.config = config

    def params(self) -> AttentionParams:
        return AttentionParams(self.wq[...], self.wk[...], self.wv[...], self.wo[...])

    def __call__(
        self, x: jax.Array, lengths: jax.Array, segment_ids: jax.Array | None = None
    ) -> jax.Array:
        spec = P(self.data_axis, self.seq_axis)
        seg = jnp.zeros(x.shape[:2], jnp.int32) if segment_ids is None else segment_ids

        def body(xb, nb, sb, pb):
            # one sequence at a time (a Python loop: a loop in the program would put the
            # exchanges inside control flow)
            out = [
                ulysses_attention(
                    xb[i],
                    nb[i, 0],
                    pb,
                    axis_name=self.seq_axis,
                    heads=self.heads,
                    segment_ids=sb[i],
                    causal=self.causal,
                    config=self.config,
                )
                for i in range(xb.shape[0])
            ]
            return jnp.stack(out)

        pspec = AttentionParams(P(), P(), P(), P())
        f = jax.shard_map(body, mesh=self.mesh, in_specs=(spec, spec, spec, pspec), out_specs=spec)
        args = (x, jnp.asarray(lengths, jnp.int32), jnp.asarray(seg, jnp.int32), self.params())
        return f(*_place(self.mesh, args, (spec, spec, spec, pspec)))


__all__ = ["MoEAux", "MoEBlock", "UlyssesAttention"]
