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
from variopath_jax.catalog.compact import enumerate_profiles
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


@pytest.mark.parametrize(
    "topo",
    [preset("fig1"), preset("fig1", 2), tiny4(), preset("r5080-bf3"), preset("balanced-8", 2)],
    ids=lambda t: f"{t.name}x{t.nodes}",
)
def test_compact_search_finds_exactly_algorithm1_profiles(topo: Topology) -> None:
    inst = build_instances(PathModel(topo))
    tree = enumerate_families(inst)
    compact = enumerate_profiles(inst)
    assert compact.shapes and set(compact.shapes) == set(tree.shapes)

    def profile(fam):
        cells: dict = {}
        for i, c in fam:
            it = inst.instances[i]
            cells.setdefault((it.src_group, it.dst_group), {}).setdefault(it.rate, 0)
            cells[(it.src_group, it.dst_group)][it.rate] += c
        return tuple(
            (a, d, tuple(sorted(v.items(), key=lambda kv: -kv[0])))
            for (a, d), v in sorted(cells.items())
        )

    reference = {
        (k, profile(f)) for k, fams in zip(tree.shapes, tree.families, strict=True) for f in fams
    }
    found = {(k, p) for k, ps in zip(compact.shapes, compact.profiles, strict=True) for p in ps}
    assert found == reference
    # every witness realises its own profile
    for ps, ws in zip(compact.profiles, compact.witnesses, strict=True):
        assert [profile(w) for w in ws] == list(ps)


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
