"""Fluid flow-level network simulator and its network model (DESIGN.md "Network model";
docs/simulator.md)."""

from variopath_jax.sim.fluid import (
    DEFAULT_COALESCE,
    DEFAULT_LAMBDA_S,
    FluidSimulator,
    SimResult,
    max_min_rates,
    simulate,
)
from variopath_jax.sim.network import (
    LINK_CLASSES,
    NETWORK_MODELS,
    NONE,
    PCIE,
    PCIE_FAIR,
    UNPROFILED_MODELS,
    NetworkModel,
    NetworkModelError,
    RootPorts,
    legacy_model,
    load_network,
    load_networks,
    model_names,
)

__all__ = [
    "DEFAULT_COALESCE",
    "DEFAULT_LAMBDA_S",
    "LINK_CLASSES",
    "NETWORK_MODELS",
    "NONE",
    "PCIE",
    "PCIE_FAIR",
    "UNPROFILED_MODELS",
    "FluidSimulator",
    "NetworkModel",
    "NetworkModelError",
    "RootPorts",
    "SimResult",
    "legacy_model",
    "load_network",
    "load_networks",
    "max_min_rates",
    "model_names",
    "simulate",
]
