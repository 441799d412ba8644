"""Candidate paths, footprints, rates, dominance pruning and rank groups."""

from __future__ import annotations

import json

import pytest

from variopath_jax.errors import TopologyError
from variopath_jax.topology import Device, NodeSpec, PathModel, Topology, preset
from variopath_jax.topology.paths import Route, prune_dominated


def names(model: PathModel, links) -> list[str]:
    return [model.graph.link_name(lid) for lid in links]


def test_fig1_groups_and_routes() -> None:
    model = PathModel(preset("fig1"))
    assert [list(g) for g in model.groups] == [[0, 1, 2], [3, 4, 5]]
    assert model.group_size == 3
    # same group: the PIX path, no shared resource, full 64 GB/s
    (pix,) = model.routes(0, 0)
    assert pix.cls == "PIX" and pix.links == () and pix.rate == 64.0
    # across the switches: B (PXB, 64 GB/s) and N (through NIC0, the network and NIC1, 50 GB/s)
    routes = {r.cls: r for r in model.routes(0, 1)}
    assert set(routes) == {"PXB", "NIC"}
    assert names(model, routes["PXB"].links) == ["n0/sw0->n0/sw", "n0/sw->n0/sw1"]
    assert routes["PXB"].rate == 64.0
    assert names(model, routes["NIC"].links) == [
        "n0/sw0->n0/nic0",
        "n0/nic0->net",
        "net->n0/nic1",
        "n0/nic1->n0/sw1",
    ]
    assert routes["NIC"].rate == 50.0 and routes["NIC"].nics == (0, 1)


def test_concrete_paths_add_endpoint_links() -> None:
    model = PathModel(preset("fig1"))
    paths = model.paths(0, 4)
    assert [p.cls for p in paths] == ["PXB", "NIC"]  # fastest first
    p = paths[0]
    assert names(model, p.links) == [
        "n0/gpu0->n0/sw0",
        "n0/sw0->n0/sw",
        "n0/sw->n0/sw1",
        "n0/sw1->n0/gpu4",
    ]
    up, _ = model.endpoint_links(0)
    assert up == p.links[0] and up not in p.footprint
    with pytest.raises(TopologyError, match="itself"):
        model.paths(2, 2)


def test_two_node_preset_paths() -> None:
    topo = preset("r5080-bf3", 2)
    model = PathModel(topo)
    assert len(model.groups) == 8 and model.group_size == 2
    assert [list(g) for g in model.groups[:2]] == [[0, 1], [2, 3]]
    # rank 0 (node 0, leaf sw0) to rank 8 (node 1, leaf sw0): through the two rail-local NICs
    (net,) = model.routes(0, 4)
    assert net.cls == "NET" and net.rate == 50.0 and net.nics == (0, 4)
    assert names(model, net.links) == [
        "n0/sw0->n0/nic0",
        "n0/nic0->net",
        "net->n1/nic0",
        "n1/nic0->n1/sw0",
    ]
    # translated routes of other node pairs use that pair's links
    (back,) = model.routes(5, 1)
    assert names(model, back.links) == [
        "n1/sw1->n1/nic1",
        "n1/nic1->net",
        "net->n0/nic1",
        "n0/nic1->n0/sw1",
    ]
    # cross-socket inside a node: SYS over the inter-socket link, and the NIC loop
    classes = sorted(r.cls for r in model.routes(0, 2))
    assert classes == ["NIC", "SYS"]
    sys_route = next(r for r in model.routes(0, 2) if r.cls == "SYS")
    assert "n0/cpu0->n0/cpu1" in names(model, sys_route.links)
    counts = model.class_counts()
    assert counts["NET"] == 16 * 8 and counts["PIX"] == 16


def test_translation_matches_direct_enumeration() -> None:
    """Routes moved from the template nodes equal routes enumerated on the real nodes."""
    topo = preset("r5090-bf3", 3)
    model = PathModel(topo)
    fresh = PathModel(topo)
    for a, d in [(9, 2), (4, 11), (10, 10), (8, 9)]:
        moved = model.routes(a, d)
        direct = prune_dominated(fresh._enumerate(a, d))
        assert [(r.cls, r.links, r.rate, r.nics) for r in moved] == [
            (r.cls, r.links, r.rate, r.nics) for r in direct
        ]


def test_ring_offers_both_directions() -> None:
    model = PathModel(preset("r5090-bf3"))
    routes = model.routes(0, 2)  # switch 0 to switch 2, opposite on the ring, other socket
    direct = sorted((r.cls, len(r.links)) for r in routes if r.cls != "NIC")
    assert direct == [("PXB", 2), ("PXB", 2)]  # both ways round; never up through the CPUs
    adjacent = sorted((r.cls, len(r.links)) for r in model.routes(0, 1) if r.cls != "NIC")
    assert adjacent == [("PXB", 1)]
    # without fabric links, cross-switch P2P goes through the host
    assert {r.cls for r in PathModel(preset("l20-cx7")).routes(0, 1)} == {"PHB", "NIC"}


def test_without_p2p_gpu_traffic_bounces_through_host_memory() -> None:
    base = preset("fig1")
    model = PathModel(Topology(base.node, p2p=False))
    (shm,) = [r for r in model.routes(0, 0) if r.cls != "NIC"]
    assert shm.cls == "SHM"
    assert names(model, shm.links) == [
        "n0/sw0->n0/sw",
        "n0/sw->n0/cpu0",
        "n0/cpu0->n0/sw",
        "n0/sw->n0/sw0",
    ]


def test_without_gdr_nic_traffic_is_staged_in_host_memory() -> None:
    base = preset("fig1", 2)
    model = PathModel(Topology(base.node, 2, gdr=False))
    (net,) = model.routes(0, 2)
    assert names(model, net.links)[:4] == [
        "n0/sw0->n0/sw",
        "n0/sw->n0/cpu0",
        "n0/cpu0->n0/sw",
        "n0/sw->n0/sw0",
    ]


def test_nic_policies() -> None:
    topo = preset("r5080-bf3", 2)
    nearest = PathModel(topo).routes(0, 4)
    socket = PathModel(topo, nic_policy="socket").routes(0, 4)
    every = PathModel(topo, nic_policy="all").routes(0, 4)
    assert len(nearest) == 1 < len(socket) < len(every)
    with pytest.raises(TopologyError, match="nic_policy"):
        PathModel(topo, nic_policy="closest")


def test_efficiency_profile() -> None:
    model = PathModel(preset("fig1"), efficiency={"NIC": 0.5})
    rates = {r.cls: r.rate for r in model.routes(0, 1)}
    assert rates == {"PXB": 64.0, "NIC": 25.0}
    assert PathModel(preset("fig1"), efficiency=0.75).routes(0, 0)[0].rate == 48.0
    with pytest.raises(TopologyError, match="efficiency"):
        PathModel(preset("fig1"), efficiency=1.5)


def test_prune_dominated() -> None:
    r = lambda links, rate, cls="PXB": Route(0, 1, cls, tuple(links), rate)  # noqa: E731
    a, b, c, d = r([1, 2], 64), r([1, 2, 3], 64), r([1, 2], 50), r([4], 10)
    kept = prune_dominated([b, c, a, d])
    assert kept == [a, d]  # b: superset at equal rate; c: same footprint, lower rate
    dup = r([2, 1], 64)
    assert len(prune_dominated([a, dup])) == 1  # same footprint and rate: one survives


def test_groups_check_equivalence() -> None:
    """GPUs under one switch with different link widths are not topology-equivalent."""
    node = NodeSpec(
        (
            Device("cpu0", "cpu"),
            Device("sw0", "switch", "cpu0", 64, 64),
            Device("gpu0", "gpu", "sw0", 64, 64),
            Device("gpu1", "gpu", "sw0", 64, 64),
            Device("gpu2", "gpu", "sw0", 32, 32),
        )
    )
    model = PathModel(Topology(node))
    assert [list(g) for g in model.groups] == [[0, 1], [2]]
    assert model.group_size is None
    (route,) = model.routes(0, 1)
    assert route.cls == "PIX" and route.rate == 32.0


def _profile(tmp_path, **doc) -> str:
    path = tmp_path / "profile.json"
    path.write_text(json.dumps({"format": "variopath-path-profile", "version": 1, **doc}))
    return str(path)


def test_a_path_profile_rates_the_paths_and_keys_the_catalog(tmp_path) -> None:
    """Measured rates cap their class, efficiencies scale theirs, and the catalog key changes."""
    from variopath_jax.topology.paths import load_path_profile

    topo = preset("r5080-bf3", 2)
    base = PathModel(topo)
    profile = load_path_profile(
        _profile(tmp_path, source="test", efficiency={"NET": 0.5}, rate_gbs={"SYS": 7.5})
    )
    model = profile.model(topo)
    assert model.identity() != base.identity()
    assert model.replace(only_nearest=True).rate_gbs == model.rate_gbs
    seen = set()
    for a in range(len(model.groups)):
        for d in range(len(model.groups)):
            before = {(r.cls, r.links): r.rate for r in base.routes(a, d)}
            for r in model.routes(a, d):  # (capping may prune a route a faster one dominates)
                if (r.cls, r.links) not in before:
                    continue
                expected = {
                    "SYS": min(before[r.cls, r.links], 7.5),
                    "NET": before[r.cls, r.links] * 0.5,
                }
                assert r.rate == pytest.approx(expected.get(r.cls, before[r.cls, r.links]))
                seen.add(r.cls)
    assert {"SYS", "NET"} <= seen


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"rate_gbs": {"XYZ": 1.0}}, "unknown path class"),
        ({"rate_gbs": {"SYS": -2}}, "rate_gbs for SYS must be a positive number"),
        ({"efficiency": 1.5}, "efficiency for \\* must be in"),
        ({"efficiency": {"NET": "fast"}}, "must be a number"),
        ({"speed": 3}, "unknown keys \\['speed'\\]"),
        ({"version": 9}, "version 9"),
    ],
)
def test_a_bad_path_profile_is_refused(tmp_path, doc: dict, message: str) -> None:
    from variopath_jax.topology.paths import load_path_profile

    with pytest.raises(TopologyError, match=message):
        load_path_profile(_profile(tmp_path, **doc))
