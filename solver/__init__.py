"""OR-Tools optimisation for VarioPath: the TE-CCL epoch model (certified oracle), the channel
model per K and the channel-pool MILP with their bounds, the LP lower bound, the catalog verifier.

Shipped as ``variopath_jax.solver`` (see pyproject ``tool.scikit-build.wheel.packages``).
"""
