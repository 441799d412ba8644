"""Fluid flow-level network simulator (DESIGN.md "Simulator"; docs/simulator.md)."""

from variopath_jax.sim.fluid import (
    DEFAULT_ALPHA_S,
    DEFAULT_COALESCE,
    DEFAULT_LAMBDA_S,
    FluidSimulator,
    SimResult,
    max_min_rates,
    simulate,
)

__all__ = [
    "DEFAULT_ALPHA_S",
    "DEFAULT_COALESCE",
    "DEFAULT_LAMBDA_S",
    "FluidSimulator",
    "SimResult",
    "max_min_rates",
    "simulate",
]
