"""``variopath profile`` (issue 27, item 4): the emulated machine's rules by hand, the profiler
recovering injected parameters within 5%, the files it writes loading and planning, refits
reproducing the fit, and bad input named."""

from __future__ import annotations

import json

import numpy as np
import pytest

from variopath_jax.cli import main
from variopath_jax.profile import (
    EmulatedBackend,
    Injected,
    Plan,
    ProfileError,
    Transfer,
    fit,
    measure,
    report,
)
from variopath_jax.profile.cases import CASES, REPEATS_WITH_JITTER, compare, contention
from variopath_jax.profile.fit import fit_eta
from variopath_jax.sim import load_network
from variopath_jax.topology.paths import load_path_profile

REL = 0.05  # the issue's bar: every injected parameter back within 5%


def failures(injected: Injected, fitted: dict) -> list[str]:
    """Every injected parameter the fit missed by more than 5% (empty: all recovered)."""
    return [
        f"{r['parameter']}: fitted {r['fitted']:.5g}, injected {r['injected']:.5g}"
        for r in compare(injected, fitted)
        if r["error"] > REL
    ]


@pytest.mark.parametrize("case", sorted(CASES))
def test_fit_recovers_every_injected_parameter(case: str) -> None:
    injected = CASES[case]
    plan = Plan(repeats=REPEATS_WITH_JITTER) if injected.jitter else Plan()
    fitted = fit(measure(EmulatedBackend(injected), plan))
    assert failures(injected, fitted) == []
    # the fitted rule explains every point measured, within the fit's tolerance (a lossy switch
    # link under the NIC probe's sender costs nic_out up to 1.5% in "paced-lossless")
    for cls, p in fitted["classes"].items():
        # plus the noise of a differential rate under jitter (up to about 3x the jitter)
        assert p["max_error"] <= fitted["tolerance"] + 3 * injected.jitter, cls


# ----- the emulated machine's rules, by hand ---------------------------------------------------
def one_link_machine(beta: float, floor: float, lossless: bool, **costs: float) -> EmulatedBackend:
    """The emulated machine's PHB route crosses the root links (32 GB/s) and switch links (64)."""
    return EmulatedBackend(
        Injected(contention=contention(root_p2p=(beta, floor, lossless)), **costs)
    )


def test_emulator_shares_and_loses_by_its_rules() -> None:
    gb = 1e9
    phb = 1  # path_routes()["PHB"]
    lossy = one_link_machine(1.0, 0.0, False, issue_s=0.0, latency_pcie_s=0.0)
    # two unpaced flows of 32 GB at η(2) = 1/2 of 32 GB/s: 16 GB/s together, 4 s
    assert np.allclose(lossy.run([Transfer(phb, 32 * 10**9)] * 2), [4.0, 4.0])
    # paced at 8 GB/s each (caps fit): the class is not paced-lossless, so η(2) still applies:
    # 16 GB/s together, each at its 8 GB/s cap: 32 GB in 4 s
    paced = [Transfer(phb, 32 * 10**9, cap_bps=8 * gb)] * 2
    assert np.allclose(lossy.run(paced), [4.0, 4.0])
    # capped at 12 GB/s each: η(2) leaves 16 GB/s, 8 each: 4 s; lossless: 12 each, 8/3 s
    capped = [Transfer(phb, 32 * 10**9, cap_bps=12 * gb)] * 2
    assert np.allclose(lossy.run(capped), [4.0, 4.0])
    fine = one_link_machine(1.0, 0.0, True, issue_s=0.0, latency_pcie_s=0.0)
    assert np.allclose(fine.run(capped), [32 / 12] * 2)
    # caps of 20 GB/s each add up to 40 > 32: oversubscribed, η(2) = 1/2 even when lossless
    assert np.allclose(fine.run([Transfer(phb, 32 * 10**9, cap_bps=20 * gb)] * 2), [4.0, 4.0])
    # a short flow ends, the other then has the link alone at 32 GB/s: 8 GB at 16 (1 s), then
    # the rest 24 GB at 32 (0.75 s)
    assert np.allclose(
        lossy.run([Transfer(phb, 8 * 10**9), Transfer(phb, 32 * 10**9)]), [1.0, 1.75]
    )


def test_emulator_charges_o_l_sigma_lambda() -> None:
    o, lat, sig, lam = 1e-6, 2e-6, 3e-6, 5e-6
    m = one_link_machine(0.0, 0.0, True, issue_s=o, latency_pcie_s=lat, signal_s=sig, barrier_s=lam)
    pix = 0
    one = [Transfer(pix, 0)]
    assert np.allclose(m.run(one), [o + lat])
    # one grouped post for a step's transfers from one endpoint
    assert np.allclose(m.run(one * 3), [o + lat] * 3)
    # posts of their own, after transfer 0: ready σ after it ended, then serialised (o each)
    own = m.run(one + [Transfer(pix, 0, after=0)] * 2)
    first = o + lat
    assert np.allclose(own, [first, first + sig + o + lat, first + sig + 2 * o + lat])
    # a barrier step starts λ after the previous one ended
    steps = m.run([Transfer(pix, 0, step=s) for s in range(3)])
    assert np.allclose(np.diff(steps), [lam + o + lat] * 2)


# ----- the fit on its own ----------------------------------------------------------------------
def test_fit_eta_finds_plateau_and_slope() -> None:
    ks = np.arange(1, 17)
    eta = np.maximum(0.3, 1 / (1 + 0.4 * (ks - 1)))
    got = fit_eta(ks, eta)
    assert got["beta"] == pytest.approx(0.4) and got["floor"] == pytest.approx(0.3)
    assert fit_eta(ks, np.ones(16)) == {"beta": 0.0, "floor": 0.0, "plateau_from": None}
    with pytest.raises(ProfileError, match="positive"):
        fit_eta(ks, np.zeros(16))


# ----- the CLI, the files and their round trip -------------------------------------------------
def run_json(capsys, *argv: str) -> dict:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_cli_writes_files_that_load_plan_and_simulate(capsys, tmp_path) -> None:
    net = tmp_path / "net.json"
    out = run_json(capsys, "profile", "--out", str(net), "--inject", "pcie")
    paths = tmp_path / "net.paths.json"
    assert out["network_file"] == str(net) and out["path_profile_file"] == str(paths)
    assert out["backend"] == "emulated" and out["unmeasured"] == []
    model = load_network(str(net))
    for cls, params in out["classes"].items():
        for key in ("beta", "floor", "paced_lossless"):
            assert model.contention[cls][key] == pytest.approx(params[key])
        assert "variopath profile" in model.contention[cls]["paced_source"]
    assert model.issue_s == pytest.approx(out["costs"]["issue_s"])
    # the pcie defaults injected come back: root classes lose paced or not
    assert not model.contention["root_p2p"]["paced_lossless"]
    assert model.contention["root_p2p"]["beta"] == pytest.approx(7.5, rel=REL)
    assert out["staged_over_direct"]["PHB"] == pytest.approx(24 / 32, rel=REL)
    profile = load_path_profile(str(paths))
    assert dict(profile.rate_gbs)["PHB"] == pytest.approx(32.0, rel=REL)
    for scheduler in ("nccl", "variopath"):
        run = run_json(
            capsys,
            *("run", "--topology", "fig1", "--scheduler", scheduler, "--workload", "uniform"),
            *("--bytes-per-pair", "64KiB", "--contention", str(net), "--path-profile", str(paths)),
        )
        assert run["valid"] and run["completion_s"] > 0


def test_refit_reproduces_the_fit(capsys, tmp_path) -> None:
    net = tmp_path / "net.json"
    first = run_json(capsys, "profile", "--out", str(net), "--inject", "none", "--jitter", "0.01")
    again = run_json(capsys, "profile", "--refit", str(net))
    assert again["network_file"] is None
    assert again["classes"] == first["classes"] and again["costs"] == first["costs"]
    loose = run_json(capsys, "profile", "--refit", str(net), "--tolerance", "0.3")
    assert all(p["beta"] == 0.0 for p in loose["classes"].values())
    # the raw measurements are kept; fitting them in Python gives the same numbers
    raw = report.read_raw(net)
    assert fit(raw)["costs"] == first["costs"]


def test_human_output(capsys, tmp_path) -> None:
    assert main(["profile", "--out", str(tmp_path / "n.json"), "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "root_p2p" in text and "paced_lossless" in text and "n.paths.json" in text


# ----- bad input -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--pair", "PHB:0-4", "--backend", "cuda"], "expected CLASS=SRC,DST"),
        (["--backend", "cuda"], "needs --pair"),
        (["--jitter", "1.5"], "--jitter"),
        (["--inject", "nope"], "unknown network model"),
        (["--nbytes", "1KiB"], "nbytes"),
        (["--posts", "1"], "posts"),
        (["--tolerance", "0.9"], "tolerance"),
    ],
)
def test_cli_bad_input_is_named(capsys, tmp_path, argv: list[str], message: str) -> None:
    assert main(["profile", "--out", str(tmp_path / "n.json"), *argv]) == 2
    assert message in capsys.readouterr().err


def test_bad_files_and_experiments_are_named(capsys, tmp_path) -> None:
    plain = tmp_path / "plain.json"
    load_network("pcie").save(plain)
    assert main(["profile", "--refit", str(plain)]) == 2
    assert "holds no raw measurements" in capsys.readouterr().err
    assert main(["profile", "--refit", str(tmp_path / "missing.json")]) == 2
    assert "missing.json" in capsys.readouterr().err
    with pytest.raises(ProfileError, match="lack 'costs'"):
        fit({"plan": {}, "machine": {}, "paths": {}, "classes": {}})
    m = EmulatedBackend(Injected())
    with pytest.raises(ProfileError, match="transfer 1: after must name an earlier"):
        m.run([Transfer(0, 8), Transfer(0, 8, after=1)])
    with pytest.raises(ProfileError, match="transfer 0: route does not exist"):
        m.run([Transfer(999, 8)])
    with pytest.raises(ProfileError, match="unknown link classes"):
        EmulatedBackend(Injected(contention={"pcie_magic": {"beta": 1.0}}))
    with pytest.raises(ProfileError, match="need beta >= 0"):
        EmulatedBackend(Injected(contention=contention(switch=(-1.0, 0.0, True))))
    with pytest.raises(ProfileError, match="flow counts"):
        Plan(flow_counts=(2, 4))


def test_cuda_backend_without_a_gpu_says_why(capsys, tmp_path) -> None:
    """Here no GPU answers: the CUDA backend (never run on a GPU) fails with the CUDA error, or
    names the missing CUDA build."""
    argv = ["profile", "--backend", "cuda", "--pair", "PHB=0,1", "--out", str(tmp_path / "n.json")]
    assert main(argv) == 2
    assert "backend cuda: " in capsys.readouterr().err
    assert not (tmp_path / "n.json").exists()
