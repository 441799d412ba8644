"""How closely `variopath profile` fits back what the emulated machine was given: every injected
parameter of every case in variopath_jax/profile/cases.py, injected beside fitted, with the
relative error (the issue's bar: 5%). A virtual clock, so the figures are exact to rounding
except where a case injects jitter.

Run: ``python benchmarks/profile_accuracy.py`` (``--json`` for the rows).
"""

from __future__ import annotations

import argparse
import json

from variopath_jax.profile import EmulatedBackend, Plan, fit, measure
from variopath_jax.profile.cases import CASES, REPEATS_WITH_JITTER, compare


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args()
    rows = []
    for name, injected in CASES.items():
        plan = Plan(repeats=REPEATS_WITH_JITTER) if injected.jitter else Plan()
        fitted = fit(measure(EmulatedBackend(injected), plan))
        rows += [{"case": name, **r} for r in compare(injected, fitted)]
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print(f"{'case':<16}{'parameter':<26}{'injected':>12}{'fitted':>12}{'error':>9}")
    for r in rows:
        print(
            f"{r['case']:<16}{r['parameter']:<26}{float(r['injected']):>12.5g}"
            f"{float(r['fitted']):>12.5g}{r['error']:>9.2%}"
        )
    worst = max(rows, key=lambda r: r["error"])
    print(f"worst: {worst['case']} {worst['parameter']} {worst['error']:.3%} (bar: 5%)")


if __name__ == "__main__":
    main()
