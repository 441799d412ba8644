"""Fluid flow-level network simulator (DESIGN.md "Simulator")."""

from variopath_jax.sim.fluid import (
    DEFAULT_ALPHA_S,
    DEFAULT_LAMBDA_S,
    FluidSimulator,
    SimResult,
    max_min_rates,
    simulate,
)

__all__ = [
    "DEFAULT_ALPHA_S",
    "DEFAULT_LAMBDA_S",
    "FluidSimulator",
    "SimResult",
    "max_min_rates",
    "simulate",
]
