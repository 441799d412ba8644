"""The channel-family catalog: instances, Algorithm 1, the compact search, the factored form,
brute-force verification, serialisation (Python and C++), the cache and bad input."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from helpers import tiny4

from variopath_jax.catalog import (
    CatalogError,
    build_catalog,
    build_instances,
    get_catalog,
    node_pattern,
    realizable,
    store,
)
from variopath_jax.catalog.build import enumerate_families
from variopath_jax.catalog.compact import enumerate_profiles, lanes_of
from variopath_jax.catalog.verify import bruteforce
from variopath_jax.topology import Device, NodeSpec, PathModel, Topology, preset


def test_fig1_instances() -> None:
    inst = build_instances(PathModel(preset("fig1")))
    assert [list(g) for g in inst.groups] == [[0, 1, 2], [3, 4, 5]]
    summary = [
        (
            it.src_group,
            it.dst_group,
            it.cls,
            it.rate,
            it.multiplicity,
            it.mask.bit_count(),
            len(it.pools),
        )
        for it in inst.instances
    ]
    assert summary == [
        (0, 0, "PIX", 64.0, 3, 0, 0),  # same switch: no shared resource, up to 3 lanes
        (0, 1, "PXB", 64.0, 1, 2, 0),
        (0, 1, "NIC", 50.0, 1, 0, 2),  # through NIC0 and NIC1: one unit of each NIC pool
        (1, 0, "PXB", 64.0, 1, 2, 0),
        (1, 0, "NIC", 50.0, 1, 0, 2),
        (1, 1, "PIX", 64.0, 3, 0, 0),
    ]


def test_two_node_instances_and_halves() -> None:
    topo = preset("r5080-bf3", 2)
    flat = build_instances(PathModel(topo))
    assert len(flat.groups) == 8 and flat.group_size == 2
    net = [it for it in flat.instances if it.cls == "NET"]
    assert len(net) == 32 and all(it.rate == 50.0 for it in net)  # 4 x 4 group pairs each way
    cat = build_catalog(topo, kind="factored")
    halves = [it for it in cat.instances.instances if it.cls in ("OUT", "IN")]
    assert cat.instances.free_group == 4 and len(halves) == 8
    assert all(it.rate == 50.0 and it.multiplicity == 1 for it in halves)


def _node_instances(topo: Topology):
    """The instances ``build_catalog`` searches: a flat set for one node, else one node's groups
    and the other nodes O."""
    if topo.nodes == 1:
        return build_instances(PathModel(topo))
    model = PathModel(topo.with_nodes(1))
    return build_instances(model, list(range(model.groups_per_node)), outside=True)


def _rate_profile(inst, fam):
    """A family's lanes per rate in every group pair, as ``CompactTree.profile`` writes them."""
    cells: dict = {}
    for i, c in fam:
        it = inst.instances[i]
        cells.setdefault((it.src_group, it.dst_group), {}).setdefault(it.rate, 0)
        cells[(it.src_group, it.dst_group)][it.rate] += c
    return tuple(
        (a, d, tuple(sorted(v.items(), key=lambda kv: -kv[0])))
        for (a, d), v in sorted(cells.items())
    )


@pytest.mark.parametrize(
    "topo",
    [preset("fig1"), preset("fig1", 2), tiny4(), preset("r5080-bf3"), preset("balanced-8", 2)],
    ids=lambda t: f"{t.name}x{t.nodes}",
)
def test_compact_search_finds_exactly_algorithm1_profiles(topo: Topology) -> None:
    inst = build_instances(PathModel(topo))
    tree = enumerate_families(inst)
    compact = enumerate_profiles(inst, pruning="none")
    shapes = [tuple(int(x) for x in s.reshape(-1)) for s in compact.shapes]
    assert shapes and set(shapes) == set(tree.shapes)
    reference = {
        (k, _rate_profile(inst, f))
        for k, fams in zip(tree.shapes, tree.families, strict=True)
        for f in fams
    }
    found = {(shapes[s], compact.profile(k)) for k, s in enumerate(compact.family_shape)}
    assert found == reference and len(compact.families) == len(reference)
    # every witness realises its own profile
    for k, w in enumerate(compact.families):
        assert _rate_profile(inst, w) == compact.profile(k)


@pytest.mark.parametrize(
    "topo",
    [
        preset("fig1", 2),
        preset("balanced-8", 2),
        preset("r5080-bf3"),
        preset("r5080-bf3", 2),
        preset("r5080-cx8", 2),
        preset("l20-cx7"),
        pytest.param(preset("r5090-bf3"), marks=pytest.mark.slow),
    ],
    ids=lambda t: f"{t.name}x{t.nodes}",
)
def test_pruning_in_the_search_gives_the_end_of_search_catalog(topo: Topology) -> None:
    """Dominance pruning during the search returns exactly what enumerating every profile and
    pruning at the end returns: the same shapes in the same order, per shape the same profiles
    in the same order, the same witnesses."""
    inst = _node_instances(topo)
    fast = enumerate_profiles(inst)
    end = enumerate_profiles(inst, pruning="end")
    assert np.array_equal(fast.shapes, end.shapes)
    assert fast.families == end.families and fast.codes == end.codes
    assert np.array_equal(fast.family_shape, end.family_shape)


def test_the_end_of_search_reference_prunes_dominated_profiles() -> None:
    """The reference keeps, of every shape's realizable profiles, exactly those that no other
    profile of the shape dominates."""
    inst = _node_instances(preset("r5080-bf3", 2))
    raw = enumerate_profiles(inst, pruning="none")
    end = enumerate_profiles(inst, pruning="end")
    assert (len(raw.families), len(end.families)) == (6140, 4937)  # as the old build found

    def rates(k: int) -> list[float]:
        lanes = lanes_of(raw.profile(k))
        return [r for cell in sorted(lanes) for r in lanes[cell]]

    kept = set(end.codes)
    for s in range(len(raw.shapes)):
        ks = [int(k) for k in np.flatnonzero(raw.family_shape == s)]
        for k in ks:
            dominated = any(
                j != k and all(x >= y for x, y in zip(rates(j), rates(k), strict=True)) for j in ks
            )
            assert dominated == (raw.codes[k] not in kept)


def test_compact_search_limit_and_progress() -> None:
    """Long searches report progress every 10,000 profiles; past ``max_families`` the build
    stops with an error that names the limit."""
    seen: list[int] = []
    tree = enumerate_profiles(_node_instances(preset("r5090-bf3")), progress=seen.append)
    assert len(tree.families) == 29_881
    assert seen == sorted(seen) and 20_000 <= seen[-1] <= len(tree.families)
    with pytest.raises(CatalogError, match=r"more than 100 rate profiles \(max_families\)"):
        build_catalog(preset("r5080-bf3", 2), max_families=100)
    with pytest.raises(CatalogError, match="unknown pruning"):
        enumerate_profiles(_node_instances(preset("fig1")), pruning="later")


def test_fig1_catalog_matches_the_paper_example() -> None:
    cat = build_catalog(preset("fig1"), method="dfs")
    # three realizable shapes (0, 1 or 2 cross-switch lanes each way) and their families
    assert sorted(int(s[0, 1]) for s in cat.shapes) == [0, 1, 2]
    assert len(cat.families) == 6
    # the shape of Figure 1's stage C: two lanes each way across the switches (one PXB, one NIC)
    two = next(k for k, s in enumerate(cat.shapes) if s[0, 1] == 2)
    (fam,) = [cat.families[k] for k in cat.families_of(two)]
    classes = sorted(cat.instances.instances[i].cls for i, c in fam for _ in range(c))
    assert classes == ["NIC", "NIC", "PIX", "PIX", "PXB", "PXB"]


@pytest.mark.parametrize("topo", [preset("fig1"), tiny4()], ids=lambda t: t.name)
@pytest.mark.parametrize("method", ["dfs", "profiles"])
def test_sound_and_complete_against_brute_force(topo: Topology, method: str) -> None:
    cat = build_catalog(topo, method=method)
    report = bruteforce(cat, PathModel(topo))
    assert report.sound and report.complete, report.problems
    assert report.channels > 0 and report.shapes_found == len(cat.shapes)


def test_brute_force_detects_a_broken_catalog() -> None:
    cat = build_catalog(preset("fig1"))
    cat.shapes = cat.shapes[:-1]
    cat.families = [
        f for f, s in zip(cat.families, cat.family_shape, strict=True) if s < len(cat.shapes)
    ]
    cat.family_shape = cat.family_shape[cat.family_shape < len(cat.shapes)]
    report = bruteforce(cat, PathModel(preset("fig1")))
    assert not report.complete and "missing" in " ".join(report.problems)


def _contingency(rows, cols):
    """All non-negative integer matrices with the given row and column sums."""
    if not len(rows):
        if not any(cols):
            yield np.zeros((0, len(cols)), dtype=np.int64)
        return

    def splits(total, caps):
        if not caps:
            if total == 0:
                yield ()
            return
        for x in range(min(total, caps[0]) + 1):
            for rest in splits(total - x, caps[1:]):
                yield (x, *rest)

    for first in splits(rows[0], list(cols)):
        for rest in _contingency(rows[1:], [c - x for c, x in zip(cols, first, strict=True)]):
            yield np.vstack([np.array(first, dtype=np.int64)[None, :], rest])


@pytest.mark.parametrize("name", ["fig1", "balanced-8", "cascade-8", "direct-8"])
def test_factored_equals_flat_on_two_nodes(name: str) -> None:
    topo = preset(name, 2)
    flat = build_catalog(topo, kind="flat")
    fac = build_catalog(topo, kind="factored")
    g = fac.num_groups - 1
    composed = set()
    patterns = [s.astype(np.int64) for s in fac.shapes]
    for p0 in patterns:
        for p1 in patterns:
            for c01 in _contingency(p0[:-1, -1], p1[-1, :-1]):
                for c10 in _contingency(p1[:-1, -1], p0[-1, :-1]):
                    m = np.zeros((2 * g, 2 * g), dtype=np.int64)
                    m[:g, :g], m[g:, g:], m[:g, g:], m[g:, :g] = (
                        p0[:-1, :-1],
                        p1[:-1, :-1],
                        c01,
                        c10,
                    )
                    composed.add(m.tobytes())
    assert composed == {s.astype(np.int64).tobytes() for s in flat.shapes}
    # and the per-node check agrees with the flat catalog shape by shape
    for s in flat.shapes:
        assert realizable(fac, s)
        assert (node_pattern(s, 0, g).sum(axis=1)[:-1] == fac.group_size).all()


@pytest.mark.parametrize(
    "name", ["r5080-bf3", "r5080-cx8", pytest.param("l20-cx7", marks=pytest.mark.slow)]
)
def test_factored_without_other_nodes_is_the_flat_catalog(name: str) -> None:
    flat = build_catalog(preset(name))
    fac = build_catalog(preset(name, 2), kind="factored")
    local = {
        s[:-1, :-1].astype(np.int64).tobytes()
        for s in fac.shapes
        if not s[-1].any() and not s[:, -1].any()
    }
    assert local == {s.astype(np.int64).tobytes() for s in flat.shapes}


@pytest.mark.slow
def test_r5090_factored_catalog_builds() -> None:
    """The ring node's factored catalog (formerly over 2 M profiles, abandoned) builds, serves 2
    and 4 nodes, and agrees with the flat one-node catalog; sampled families are feasible
    channels of their shapes and no sampled profile is dominated within its shape."""
    cat = build_catalog(preset("r5090-bf3", 2))
    assert cat.kind == "factored" and (len(cat.shapes), len(cat.families)) == (775_720, 1_516_401)
    cat.check_topology(preset("r5090-bf3", 4))  # one node catalog for every node count
    assert len({s.tobytes() for s in cat.shapes}) == len(cat.shapes)
    flat = build_catalog(preset("r5090-bf3"))
    local = {
        s[:-1, :-1].astype(np.int64).tobytes()
        for s in cat.shapes
        if not s[-1].any() and not s[:, -1].any()
    }
    assert local == {s.astype(np.int64).tobytes() for s in flat.shapes}
    inst, g, free = cat.instances, cat.group_size, cat.instances.free_group
    items = inst.instances
    for k in range(0, len(cat.families), 9_973):
        lanes = np.zeros_like(cat.shapes[0], dtype=np.int64)
        used, units = 0, [0] * len(inst.pools)
        for i, count in cat.families[k]:
            it = items[i]
            assert not used & it.mask and count <= it.multiplicity
            used |= it.mask
            for p in it.pools:
                units[p] += count
            lanes[it.src_group, it.dst_group] += count
        assert all(u <= p.capacity for u, p in zip(units, inst.pools, strict=True))
        assert np.array_equal(lanes, cat.shapes[cat.family_shape[k]])
        bounded = [a for a in range(cat.num_groups) if a != free]
        assert (lanes.sum(axis=1)[bounded] == g).all() and (lanes.sum(axis=0)[bounded] == g).all()
    for s in range(0, len(cat.shapes), 7_919):
        fams = [cat.families[k] for k in cat.families_of(s)]
        rates = [
            sorted(((it.src_group, it.dst_group, -it.rate) for i, c in f for it in [items[i]] * c))
            for f in fams
        ]
        for x in rates:
            for y in rates:
                assert x == y or not all(a[2] <= b[2] for a, b in zip(x, y, strict=True))


def test_factored_catalog_does_not_grow_with_nodes() -> None:
    a = build_catalog(preset("r5080-cx8", 2), kind="factored")
    b = build_catalog(preset("r5080-cx8", 32), kind="factored")
    assert (
        a.fingerprint == b.fingerprint
        and len(a.shapes) == len(b.shapes)
        and a.families == b.families
    )


def test_serialisation_round_trip_python_and_cpp(tmp_path) -> None:
    from variopath_jax._native import catalog_info

    for topo, kind in [(preset("fig1"), "flat"), (preset("r5080-bf3", 2), "factored")]:
        cat = build_catalog(topo, kind=kind)
        path = tmp_path / f"{kind}.vpcat"
        nbytes = store.save(cat, path)
        assert nbytes == path.stat().st_size
        again = store.load(path, cat.fingerprint)
        assert again.summary() == cat.summary() and again.families == cat.families
        assert np.array_equal(again.shapes, cat.shapes) and again.instances == cat.instances
        info = catalog_info(str(path), cat.fingerprint)
        assert (info["instances"], info["shapes"], info["families"]) == (
            len(cat.instances.instances),
            len(cat.shapes),
            len(cat.families),
        )
        assert info["group_size"] == cat.group_size and info["fingerprint"] == cat.fingerprint
        assert info["sum_fam_inst"] == sum(i for f in cat.families for i, _ in f)
        assert info["sum_fam_count"] == sum(c for f in cat.families for _, c in f)
        assert info["sum_shapes"] == int(cat.shapes.sum())
        assert info["sum_route_links"] == sum(
            lid for it in cat.instances.instances for r in it.routes for lid in r.links
        )
        assert info["sum_rates"] == pytest.approx(sum(it.rate for it in cat.instances.instances))


def test_bad_catalog_files(tmp_path) -> None:
    from variopath_jax._native import catalog_info

    cat = build_catalog(preset("fig1"))
    path = tmp_path / "c.vpcat"
    store.save(cat, path)
    blob = path.read_bytes()
    cases = {
        "truncated": (blob[: len(blob) // 2], "checksum mismatch"),
        "corrupted": (blob[:100] + bytes([blob[100] ^ 0xFF]) + blob[101:], "checksum mismatch"),
        "old version": (blob[:6] + struct.pack("<H", 0) + blob[8:], "format version 0"),
        "not a catalog": (b"hello world, not a catalog", "not a variopath catalog"),
    }
    for name, (data, message) in cases.items():
        bad = tmp_path / f"{name}.vpcat"
        bad.write_bytes(data)
        with pytest.raises(CatalogError, match=message):
            store.load(bad)
        with pytest.raises(ValueError, match=message):
            catalog_info(str(bad))
    other = preset("fig1", 2).fingerprint
    with pytest.raises(CatalogError, match="rebuild it for this topology"):
        store.load(path, other)
    with pytest.raises(ValueError, match="rebuild it for this topology"):
        catalog_info(str(path), other)
    with pytest.raises(CatalogError, match=r"not .*r5080"):
        cat.check_topology(preset("r5080-bf3"))


def test_cache(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("VARIOPATH_CACHE_DIR", str(tmp_path))
    topo = preset("r5080-bf3")
    first = get_catalog(topo)
    (entry,) = tmp_path.glob("catalog-*.vpcat")
    assert topo.fingerprint in entry.name and not list(tmp_path.glob("*.tmp"))
    stamp = entry.stat().st_mtime_ns
    second = get_catalog(topo)
    assert entry.stat().st_mtime_ns == stamp and second.families == first.families
    entry.write_bytes(entry.read_bytes()[:50])  # a damaged entry is rebuilt, not trusted
    third = get_catalog(topo)
    assert third.families == first.families and store.load(entry).families == first.families


def test_bad_topologies() -> None:
    one = Topology(NodeSpec((Device("cpu0", "cpu"), Device("gpu0", "gpu", "cpu0", 64, 64))))
    with pytest.raises(CatalogError, match="at least two"):
        build_catalog(one)
    uneven = Topology(
        NodeSpec(
            (
                Device("cpu0", "cpu"),
                Device("sw0", "switch", "cpu0", 64, 64),
                Device("gpu0", "gpu", "sw0", 64, 64),
                Device("gpu1", "gpu", "sw0", 64, 64),
                Device("gpu2", "gpu", "cpu0", 64, 64),
            )
        )
    )
    with pytest.raises(CatalogError, match="unequal size"):
        build_catalog(uneven)
    over = Topology(preset("fig1").node, 2, oversubscription=2.0)
    with pytest.raises(CatalogError, match="oversubscribed"):
        build_catalog(over, kind="factored")
    assert build_catalog(over).kind == "flat"  # auto falls back to flat
    with pytest.raises(CatalogError, match="unknown catalog kind"):
        build_catalog(preset("fig1"), kind="tree")


def test_cache_remembers_a_failed_build(tmp_path, monkeypatch) -> None:
    """A build that failed is not retried until the builder's sources change."""
    import variopath_jax.catalog as catalog_pkg

    monkeypatch.setenv("VARIOPATH_CACHE_DIR", str(tmp_path))
    calls = []

    def failing(*args, **kwargs):
        calls.append(args)
        raise CatalogError("more than 5 rate profiles")

    monkeypatch.setattr(catalog_pkg, "build_catalog", failing)
    for nodes in (2, 4):  # one factored catalog serves every node count
        with pytest.raises(CatalogError, match="more than 5"):
            get_catalog(preset("r5080-bf3", nodes))
    assert len(calls) == 1
    monkeypatch.setattr(store, "_builder_hash", lambda: "another builder")
    with pytest.raises(CatalogError, match="more than 5"):
        get_catalog(preset("r5080-bf3", 2))
    assert len(calls) == 2
    with pytest.raises(CatalogError):
        get_catalog(preset("r5080-bf3", 2), cache=False)
    assert len(calls) == 3
