"""``variopath profile``: measure what the network model needs on a machine, fit its parameters
and write the network-model file and the path profile the planner reads (issue 27;
docs/simulator.md "Profiling your machine"). Three parts, each usable alone:
:func:`measure` (raw times from a :class:`Backend`), :func:`fit` (a pure function of them) and
:mod:`~variopath_jax.profile.report` (the files and the summary). The posted-write trigger probe's
situations are chosen in :mod:`~variopath_jax.profile.trigger`.
"""

from __future__ import annotations

from variopath_jax.profile.backend import (
    Backend,
    CudaBackend,
    EmulatedBackend,
    Injected,
    ProfileError,
    Transfer,
)
from variopath_jax.profile.fit import TOLERANCE, fit
from variopath_jax.profile.measure import Plan, measure

__all__ = [
    "TOLERANCE",
    "Backend",
    "CudaBackend",
    "EmulatedBackend",
    "Injected",
    "Plan",
    "ProfileError",
    "Transfer",
    "fit",
    "measure",
]
