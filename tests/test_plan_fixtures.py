"""Every family's plan as the C++ core builds it, against stored known-good plans (issue 51:
a change to a plan is a deliberate update of ``fixtures/plans.json``).

Per family, one small deployment and demand (MoE dispatch, seed 0), the decision of that family
alone (``_native.Decision(family)``: the paced families with their reference split) applied to
the demand (``NativeChooser.apply``, the whole plan, as the op's in-process transport runs it):
every transfer's ranks, bytes, path, waits and rate, the rates to a few ulps. Regenerate after a
deliberate change with ``VARIOPATH_UPDATE_PLANS=1 pytest tests/test_plan_fixtures.py`` and
review the diff of ``tests/fixtures/plans.json``.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from variopath_jax import _native, workloads
from variopath_jax.planner.reference import PlannerParams
from variopath_jax.planner.schedulers import chooser_for
from variopath_jax.schedule import validate
from variopath_jax.schedulers import unprofiled_networks
from variopath_jax.topology import PathModel
from variopath_jax.topology.presets import preset

FIXTURE = Path(__file__).parent / "fixtures" / "plans.json"
NETWORKS = unprofiled_networks(20e-6)
# family -> (preset, nodes, MoE tokens per rank): where the family is built and non-trivial
CASES = {
    "concurrent": ("r5080-bf3", 1, 16),
    "multipath": ("r5080-bf3", 1, 16),
    "staged": ("l20-cx7", 1, 2),
    "staged-balanced": ("l20-cx7", 1, 2),
    "paced": ("r5080-bf3", 2, 2),
    "rot-paced": ("l20-cx7", 1, 2),
    "barrier": ("r5080-bf3", 1, 8),
    "signal": ("r5080-bf3", 1, 8),
    "chained": ("l20-cx7", 1, 2),
}
ULPS = 4


def plan_of(family: str) -> dict:
    name, nodes, tokens = CASES[family]
    topo = preset(name, nodes)
    chooser = chooser_for(PathModel(topo), PlannerParams())
    demand = workloads.moe(topo.num_ranks, tokens, seed=0)
    schedule = chooser.apply(_native.Decision(family), demand, NETWORKS)
    assert schedule.meta["plan"] == family, f"{family} is not built on {name} x {nodes}"
    assert validate(schedule, demand, topo).ok
    return {
        "case": [name, nodes, tokens],
        "steps": [
            [
                [t.src, t.dst, t.nbytes, list(t.path), [list(a) for a in t.after], t.rate]
                for t in s.transfers
            ]
            for s in schedule.steps
        ],
    }


def _stored() -> dict:
    return json.loads(FIXTURE.read_text()) if FIXTURE.exists() else {}


def test_update_plans_when_asked() -> None:
    """``VARIOPATH_UPDATE_PLANS=1``: rewrite the stored plans from the core (else nothing)."""
    if os.environ.get("VARIOPATH_UPDATE_PLANS") != "1":
        pytest.skip("set VARIOPATH_UPDATE_PLANS=1 to rewrite tests/fixtures/plans.json")
    FIXTURE.write_text(json.dumps({f: plan_of(f) for f in CASES}, indent=None) + "\n")


def test_every_family_the_op_runs_has_a_stored_plan() -> None:
    assert set(CASES) == set(_native.FAMILIES)


@pytest.mark.parametrize("family", list(CASES))
def test_the_core_builds_the_stored_plan(family: str) -> None:
    stored = _stored().get(family)
    assert stored is not None, f"no stored plan for {family}: regenerate (module docstring)"
    built = plan_of(family)
    assert built["case"] == stored["case"]
    assert len(built["steps"]) == len(stored["steps"]), family
    for k, (mine, want) in enumerate(zip(built["steps"], stored["steps"], strict=True)):
        assert len(mine) == len(want), (family, k)
        for t, (a, b) in enumerate(zip(mine, want, strict=True)):
            assert a[:5] == b[:5], (family, k, t)
            assert abs(a[5] - b[5]) <= ULPS * math.ulp(b[5]), (family, k, t, a[5], b[5])
