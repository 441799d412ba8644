"""Run the exploration notebooks (``notebooks/``) top to bottom with a kernel in this Python.

The notebooks read ``VARIOPATH_NOTEBOOK_SIZE``: ``small`` (what ``make test`` runs, through
``tests/test_notebooks.py``) or ``full`` (the default, and ``make notebooks``). The kernel is an
IPython kernel of this interpreter whatever the notebook's metadata names, so a notebook always
runs against the project's virtual environment. Needs the ``test`` extras (nbclient, nbformat,
ipykernel)::

    python -m variopath_jax.notebooks                        # every notebook, full size
    python -m variopath_jax.notebooks --size small notebooks/01_topologies.ipynb
    python -m variopath_jax.notebooks --thumbnails docs/img/notebooks --out out/notebooks
    python -m variopath_jax.notebooks --strip                # drop outputs before committing

``--thumbnails`` writes each notebook's last picture, shrunk, as ``DIR/<name>.png`` (the
README's thumbnails); ``--out`` keeps the executed notebooks, outputs included.
"""

from __future__ import annotations

import argparse
import base64
import io
import os
import sys
import time
from pathlib import Path
from typing import Any

SIZE_VARIABLE = "VARIOPATH_NOTEBOOK_SIZE"
SIZES = ("small", "full")
FOLDER = Path("notebooks")
THUMBNAIL_WIDTH = 360


def notebook_paths(folder: Path = FOLDER) -> list[Path]:
    """The notebooks of ``folder``, in name order."""
    return sorted(folder.glob("*.ipynb"))


def _kernel_manager() -> Any:
    """A kernel manager whose every kernel name starts IPython in this interpreter."""
    from jupyter_client import KernelManager
    from jupyter_client.kernelspec import KernelSpec, KernelSpecManager

    class ThisPython(KernelSpecManager):
        def get_kernel_spec(self, kernel_name: str) -> KernelSpec:
            return KernelSpec(
                argv=[sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                display_name=f"Python ({sys.executable})",
                language="python",
                name=kernel_name,
            )

    return KernelManager(kernel_name="python3", kernel_spec_manager=ThisPython())


def execute(path: Path, size: str = "full", timeout_s: float = 600.0) -> Any:
    """Run every cell of the notebook at ``path`` (working directory: its folder) and return it
    with its outputs; a cell's error raises ``nbclient.exceptions.CellExecutionError``."""
    import nbformat
    from nbclient import NotebookClient

    if size not in SIZES:
        raise ValueError(f"size must be one of {SIZES}, got {size!r}")
    nb = nbformat.read(path, as_version=4)
    km = _kernel_manager()
    client = NotebookClient(
        nb,
        km=km,
        timeout=timeout_s,
        resources={"metadata": {"path": str(Path(path).resolve().parent)}},
    )
    try:
        client.execute(env={**os.environ, SIZE_VARIABLE: size})
    finally:  # a kernel manager the client did not create is ours to shut down
        if km.has_kernel:
            km.shutdown_kernel(now=True)
    return nb


def images(nb: Any) -> list[bytes]:
    """Every PNG the notebook's outputs hold, in order."""
    return [
        base64.b64decode(out["data"]["image/png"])
        for cell in nb.cells
        for out in cell.get("outputs", ())
        if "image/png" in out.get("data", {})
    ]


def has_outputs(nb: Any) -> bool:
    """Whether any code cell keeps outputs or an execution count."""
    return any(
        cell.get("outputs") or cell.get("execution_count") is not None
        for cell in nb.cells
        if cell.cell_type == "code"
    )


def strip(path: Path) -> bool:
    """Drop the outputs and execution counts of a notebook file; whether it changed."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    if not has_outputs(nb):
        return False
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
    nbformat.write(nb, path)
    return True


def thumbnail(png: bytes, path: Path, width: int = THUMBNAIL_WIDTH) -> Path:
    """Write ``png`` shrunk to ``width`` pixels wide (aspect kept) to ``path``."""
    from PIL import Image

    image = Image.open(io.BytesIO(png)).convert("RGB")
    image.thumbnail((width, 4 * width), Image.Resampling.LANCZOS)
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path, optimize=True)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m variopath_jax.notebooks", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: notebooks/*.ipynb")
    parser.add_argument("--size", choices=SIZES, default="full")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per cell")
    parser.add_argument("--thumbnails", type=Path, help="write each last picture here")
    parser.add_argument("--out", type=Path, help="keep the executed notebooks here")
    parser.add_argument("--strip", action="store_true", help="only drop outputs, in place")
    args = parser.parse_args(argv)
    paths = args.notebooks or notebook_paths()
    if not paths:
        parser.error(f"no notebooks in {FOLDER}/ (run from the repository root)")
    if args.strip:
        for path in paths:
            print(f"{path}: {'stripped' if strip(path) else 'clean'}")
        return 0
    import nbformat

    for path in paths:
        start = time.perf_counter()
        nb = execute(path, args.size, args.timeout)
        pictures = images(nb)
        print(
            f"{path}: {time.perf_counter() - start:.1f} s, {len(pictures)} pictures ({args.size})"
        )
        if args.thumbnails and pictures:
            thumbnail(pictures[-1], args.thumbnails / f"{path.stem}.png")
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            nbformat.write(nb, args.out / path.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
