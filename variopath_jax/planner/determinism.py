"""The deterministic building blocks the Python reference and the C++ core share exactly.

- ``SplitMix64``: the seeded generator of multi-start initial bindings (Steele et al., 2014).
- ``canonical_assignment``: a max-weight perfect assignment on integer weights; among optimal
  assignments, the lexicographically smallest (row 0's column as small as possible, then row
  1's, ...), so that two different exact solvers return the same answer.
- ``credit_units``: credits are compared as integers (µGB/s), so ties are exact everywhere.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import linear_sum_assignment

MASK64 = (1 << 64) - 1
FORBIDDEN = -(1 << 40)  # weight of a forbidden pair (a lane to its own source rank)
CREDIT_SCALE = 1e6  # integer credit units per GB/s


class SplitMix64:
    """SplitMix64; ``below(n)`` draws uniformly from [0, n) by rejection-free multiply-shift."""

    def __init__(self, seed: int) -> None:
        self.state = seed & MASK64

    def next(self) -> int:
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK64
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        return z ^ (z >> 31)

    def below(self, n: int) -> int:
        return ((self.next() >> 32) * n) >> 32

    def permutation(self, n: int) -> list[int]:
        """Fisher-Yates, drawing from the end."""
        out = list(range(n))
        for k in range(n - 1, 0, -1):
            j = self.below(k + 1)
            out[k], out[j] = out[j], out[k]
        return out


def credit_units(credit_gbs: float) -> int:
    return int(np.floor(credit_gbs * CREDIT_SCALE))


def _best(weights: np.ndarray) -> int:
    rows, cols = linear_sum_assignment(weights, maximize=True)
    return int(weights[rows, cols].sum())


def canonical_assignment(weights: np.ndarray) -> list[int]:
    """Column of each row in the lexicographically smallest max-weight assignment of the rows of
    an integer matrix to distinct columns (rows <= columns): scipy's solver for the optimum, then
    row-by-row fixing of the smallest column that keeps it."""
    w = np.asarray(weights, dtype=np.int64)
    rows, cols = w.shape
    target = _best(w)
    free_rows, free_cols = list(range(rows)), list(range(cols))
    chosen = [-1] * rows
    fixed = 0
    for r in range(rows):
        free_rows.remove(r)
        for c in list(free_cols):
            rest_cols = [x for x in free_cols if x != c]
            rest = _best(w[np.ix_(free_rows, rest_cols)]) if free_rows else 0
            if fixed + int(w[r, c]) + rest == target:
                chosen[r] = c
                fixed += int(w[r, c])
                free_cols.remove(c)
                break
    return chosen
