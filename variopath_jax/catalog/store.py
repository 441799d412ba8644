"""Catalog files: a compact, versioned container of plain arrays, and a disk cache.

Layout (little-endian), readable from Python (here) and from the C++ core (ffi/catalog.cc)::

    "VPCAT" 0x00, u16 version
    u32 number of arrays
    per array: u16 name length, name, u8 dtype (1 i16, 2 i32, 3 i64, 4 f64, 5 u8), u8 ndim,
               u64 dims[ndim], u64 byte count, bytes
    u32 CRC-32 (zlib's) of everything above

The arrays hold the instance table, concrete routes, NIC pools, shapes and families; ``meta``
(UTF-8 JSON) and ``fingerprint`` carry the rest. A truncated or altered file fails the hash; a
file of another version or for another topology is refused with a message that says so.
"""

from __future__ import annotations

import itertools
import json
import os
import secrets
import struct
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from variopath_jax import progress
from variopath_jax.catalog.catalog import Catalog
from variopath_jax.catalog.instances import CatalogError, Instance, InstanceSet, Pool
from variopath_jax.topology import Route

MAGIC = b"VPCAT\x00"
VERSION = 1
_DTYPES = {1: np.int16, 2: np.int32, 3: np.int64, 4: np.float64, 5: np.uint8}
_CODES = {np.dtype(v): k for k, v in _DTYPES.items()}


def _arrays(cat: Catalog) -> dict[str, np.ndarray]:
    inst = cat.instances
    items = inst.instances
    lanes = sum(len(f) for f in cat.families)
    flat = itertools.chain.from_iterable(itertools.chain.from_iterable(cat.families))
    pairs = np.fromiter(flat, dtype=np.int32, count=2 * lanes).reshape(lanes, 2)
    classes = sorted({it.cls for it in items})
    routes = [r for it in items for r in it.routes]
    arrays = {
        "groups": np.array(inst.groups, dtype=np.int32),
        "inst_src": np.array([it.src_group for it in items], dtype=np.int32),
        "inst_dst": np.array([it.dst_group for it in items], dtype=np.int32),
        "inst_rate": np.array([it.rate for it in items], dtype=np.float64),
        "inst_mult": np.array([it.multiplicity for it in items], dtype=np.int32),
        "inst_cls": np.array([classes.index(it.cls) for it in items], dtype=np.int32),
        "inst_pools": np.array([(*it.pools, -1, -1)[:2] for it in items], dtype=np.int32).reshape(
            -1, 2
        ),
        "inst_mask_ptr": np.cumsum([0] + [it.mask.bit_count() for it in items]).astype(np.int64),
        "inst_mask_res": np.array(
            [b for it in items for b in range(it.mask.bit_length()) if it.mask >> b & 1],
            dtype=np.int32,
        ),
        "resources": np.array(inst.resources, dtype=np.int32),
        "route_inst_ptr": np.cumsum([0] + [len(it.routes) for it in items]).astype(np.int64),
        "route_nics": np.array([r.nics or (-1, -1) for r in routes], dtype=np.int32).reshape(-1, 2),
        "route_rate": np.array([r.rate for r in routes], dtype=np.float64),
        "route_via": np.array([r.via_endpoints for r in routes], dtype=np.uint8),
        "route_link_ptr": np.cumsum([0] + [len(r.links) for r in routes]).astype(np.int64),
        "route_links": np.array([lid for r in routes for lid in r.links], dtype=np.int32),
        "pool_cap": np.array([p.capacity for p in inst.pools], dtype=np.int32),
        "pool_side": np.array([0 if p.side == "send" else 1 for p in inst.pools], dtype=np.int32),
        "pool_nic_ptr": np.cumsum([0] + [len(p.nics) for p in inst.pools]).astype(np.int64),
        "pool_nics": np.array([n for p in inst.pools for n in p.nics], dtype=np.int32),
        "shapes": cat.shapes.astype(np.int16),
        "fam_shape": cat.family_shape.astype(np.int32),
        "fam_ptr": np.cumsum([0] + [len(f) for f in cat.families]).astype(np.int64),
        "fam_inst": pairs[:, 0].copy(),
        "fam_count": pairs[:, 1].copy(),
        "fingerprint": np.frombuffer(cat.fingerprint.encode(), dtype=np.uint8),
        # what the C++ core needs from meta, as plain numbers: kind (0 flat, 1 factored),
        # the free group O (-1 if none), and the first network-block local link id
        "header": np.array(
            [
                0 if cat.kind == "flat" else 1,
                -1 if inst.free_group is None else inst.free_group,
                cat.link_offset,
            ],
            dtype=np.int64,
        ),
    }
    meta = {
        "format": "variopath-catalog",
        "version": VERSION,
        "kind": cat.kind,
        "fingerprint": cat.fingerprint,
        "paths": cat.paths,
        "method": cat.method,
        "seconds": cat.seconds,
        "link_offset": cat.link_offset,
        "free_group": -1 if inst.free_group is None else inst.free_group,
        "classes": classes,
        "route_classes": [r.cls for r in routes],
        "route_groups": [(r.src_group, r.dst_group) for r in routes],
        "stats": cat.stats,
    }
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    return arrays


def dumps(cat: Catalog) -> bytes:
    """A catalog as the bytes of a catalog file."""
    return encode_arrays(_arrays(cat))


def encode_arrays(arrays: dict[str, np.ndarray]) -> bytes:
    """The container format: named arrays, then a CRC-32 of everything before it."""
    parts = [MAGIC, struct.pack("<H", VERSION)]
    parts.append(struct.pack("<I", len(arrays)))
    for name, arr in arrays.items():
        arr = np.ascontiguousarray(arr)
        code = _CODES[arr.dtype]
        raw = name.encode()
        parts.append(struct.pack("<H", len(raw)) + raw + struct.pack("<BB", code, arr.ndim))
        parts.append(struct.pack(f"<{arr.ndim}Q", *arr.shape))
        data = arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()
        parts.append(struct.pack("<Q", len(data)) + data)
    body = b"".join(parts)
    return body + struct.pack("<I", zlib.crc32(body))


def save(cat: Catalog, path: str | Path) -> int:
    """Write atomically (a temporary file in the same directory, then a rename); return bytes."""
    blob = dumps(cat)
    _write_atomic(Path(path), blob)
    return len(blob)


def _write_atomic(path: Path, blob: bytes) -> None:
    """Write ``blob`` to a fresh temporary file next to ``path``, then rename it into place. The
    file is created with mode 0666 less the umask (0644 under the usual umask), as ``open``
    creates every other output (``mkstemp`` would leave it 0600)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(blob)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def _builder_hash() -> str:
    """A hash of the sources a catalog build depends on (the catalog and topology packages), so
    a recorded failure is forgotten when the builder changes."""
    import hashlib

    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for pkg in ("catalog", "topology"):
        for src in sorted((root / pkg).glob("*.py")):
            digest.update(src.name.encode())
            digest.update(src.read_bytes())
    return digest.hexdigest()[:16]


def save_failure(path: Path, error: str) -> None:
    """Remember, next to the cache entry ``path``, that building it failed with ``error``."""
    record = {"error": error, "builder": _builder_hash()}
    _write_atomic(path.with_name(path.name + ".failed"), json.dumps(record).encode())


def load_failure(path: Path) -> str | None:
    """The error a build of cache entry ``path`` failed with, if the same builder recorded one."""
    marker = path.with_name(path.name + ".failed")
    try:
        record = json.loads(marker.read_text())
    except (OSError, ValueError):
        return None
    return record.get("error") if record.get("builder") == _builder_hash() else None


def _read_arrays(blob: bytes, source: str) -> dict[str, np.ndarray]:
    if len(blob) < 12 or blob[:6] != MAGIC:
        raise CatalogError(f"{source}: not a variopath catalog file")
    (version,) = struct.unpack_from("<H", blob, 6)
    if version != VERSION:
        raise CatalogError(
            f"{source}: catalog format version {version}; this library reads version {VERSION}; rebuild it"
        )
    body, (stored,) = blob[:-4], struct.unpack_from("<I", blob, len(blob) - 4)
    if zlib.crc32(body) != stored:
        raise CatalogError(
            f"{source}: checksum mismatch: the file is truncated or corrupted; rebuild it"
        )
    pos = 8
    (count,) = struct.unpack_from("<I", body, pos)
    pos += 4
    arrays: dict[str, np.ndarray] = {}
    try:
        for _ in range(count):
            (nlen,) = struct.unpack_from("<H", body, pos)
            pos += 2
            name = body[pos : pos + nlen].decode()
            pos += nlen
            code, ndim = struct.unpack_from("<BB", body, pos)
            pos += 2
            shape = struct.unpack_from(f"<{ndim}Q", body, pos)
            pos += 8 * ndim
            (nbytes,) = struct.unpack_from("<Q", body, pos)
            pos += 8
            dtype = np.dtype(_DTYPES[code]).newbyteorder("<")
            arrays[name] = (
                np.frombuffer(body[pos : pos + nbytes], dtype=dtype).reshape(shape).copy()
            )
            pos += nbytes
    except (struct.error, KeyError, ValueError) as err:
        raise CatalogError(f"{source}: malformed catalog ({err})") from None
    return arrays


def loads(blob: bytes, source: str = "catalog", fingerprint: str | None = None) -> Catalog:
    """Read a catalog; with ``fingerprint``, refuse one built for another topology."""
    try:
        return _catalog(_read_arrays(blob, source), source, fingerprint)
    except KeyError as err:
        raise CatalogError(f"{source}: malformed catalog: no array {err}; rebuild it") from None


def _catalog(a: dict[str, np.ndarray], source: str, fingerprint: str | None) -> Catalog:
    meta: dict[str, Any] = json.loads(a["meta"].tobytes().decode())
    if fingerprint is not None and meta["fingerprint"] != fingerprint:
        raise CatalogError(
            f"{source}: catalog for topology {meta['fingerprint']}, not {fingerprint}: rebuild it for this topology"
        )
    classes, route_cls, route_groups = meta["classes"], meta["route_classes"], meta["route_groups"]
    routes = []
    for k in range(len(a["route_rate"])):
        links = tuple(
            int(x) for x in a["route_links"][a["route_link_ptr"][k] : a["route_link_ptr"][k + 1]]
        )
        nics = tuple(int(x) for x in a["route_nics"][k])
        src, dst = route_groups[k]
        routes.append(
            Route(
                src,
                dst,
                route_cls[k],
                links,
                float(a["route_rate"][k]),
                None if nics == (-1, -1) else nics,
                bool(a["route_via"][k]),
            )
        )
    items = []
    for i in range(len(a["inst_src"])):
        bits = a["inst_mask_res"][a["inst_mask_ptr"][i] : a["inst_mask_ptr"][i + 1]]
        mask = 0
        for b in bits:
            mask |= 1 << int(b)
        pools = tuple(int(p) for p in a["inst_pools"][i] if p >= 0)
        rs = tuple(routes[a["route_inst_ptr"][i] : a["route_inst_ptr"][i + 1]])
        items.append(
            Instance(
                i,
                int(a["inst_src"][i]),
                int(a["inst_dst"][i]),
                classes[a["inst_cls"][i]],
                float(a["inst_rate"][i]),
                mask,
                pools,
                int(a["inst_mult"][i]),
                rs,
            )
        )
    pools = [
        Pool(
            tuple(int(n) for n in a["pool_nics"][a["pool_nic_ptr"][p] : a["pool_nic_ptr"][p + 1]]),
            "send" if a["pool_side"][p] == 0 else "recv",
        )
        for p in range(len(a["pool_cap"]))
    ]
    free = meta["free_group"]
    inst = InstanceSet(
        tuple(tuple(int(r) for r in row) for row in a["groups"]),
        tuple(items),
        tuple(int(x) for x in a["resources"]),
        tuple(pools),
        None if free < 0 else free,
    )
    families = _families(a, len(items), max((it.multiplicity for it in items), default=0), source)
    return Catalog(
        kind=meta["kind"],
        fingerprint=meta["fingerprint"],
        paths=meta["paths"],
        instances=inst,
        shapes=a["shapes"].astype(np.int16),
        families=families,
        family_shape=a["fam_shape"].astype(np.int32),
        method=meta["method"],
        seconds=meta["seconds"],
        link_offset=meta["link_offset"],
        stats=meta["stats"],
    )


def _families(
    a: dict[str, np.ndarray], n_instances: int, most: int, source: str
) -> list[tuple[tuple[int, int], ...]]:
    """The families as tuples of (instance, lanes) pairs, every distinct pair one shared tuple
    (a factored catalog holds millions of families)."""
    inst, count, ptr = a["fam_inst"], a["fam_count"], a["fam_ptr"]
    if len(inst) and not (inst.min() >= 0 and inst.max() < n_instances):
        raise CatalogError(f"{source}: a family names an instance this catalog does not have")
    if len(count) and not (count.min() >= 1 and count.max() <= most):
        raise CatalogError(f"{source}: a family puts more lanes on an instance than it holds")
    width = most + 1
    table = [(i, c) for i in range(n_instances) for c in range(width)]
    pairs = list(map(table.__getitem__, (inst.astype(np.int64) * width + count).tolist()))
    bounds = ptr.tolist()
    return [tuple(pairs[lo:hi]) for lo, hi in itertools.pairwise(bounds)]


def load(path: str | Path, fingerprint: str | None = None) -> Catalog:
    path = Path(path)
    if not path.is_file():
        raise CatalogError(f"{path}: no such catalog file")
    with progress.task(f"loading the catalog {path.name} ({path.stat().st_size / 2**20:,.1f} MiB)"):
        return loads(path.read_bytes(), str(path), fingerprint)


def cache_dir() -> Path:
    """``$VARIOPATH_CACHE_DIR``, else ``~/.cache/variopath_jax``."""
    root = os.environ.get("VARIOPATH_CACHE_DIR")
    return Path(root) if root else Path.home() / ".cache" / "variopath_jax"


def cache_path(fingerprint: str, kind: str, method: str, paths: str) -> Path:
    import hashlib

    tag = hashlib.sha256(paths.encode()).hexdigest()[:8]
    return cache_dir() / f"catalog-{fingerprint}-{kind}-{method}-{tag}.vpcat"
