"""OR-Tools optimisation for VarioPath: MILP oracle, LP lower bound, catalog verifier.

Shipped as ``variopath_jax.solver`` (see pyproject ``tool.scikit-build.wheel.packages``).
"""
