"""The notebooks under notebooks/: stored without outputs, each run top to bottom at the small
size (``VARIOPATH_NOTEBOOK_SIZE=small``) in a kernel of this interpreter, each ending in a
picture, each linked from the README with its thumbnail; and the runner's own pieces."""

from __future__ import annotations

import base64
import io
from pathlib import Path

import nbformat
import pytest
from PIL import Image

from variopath_jax.notebooks import (
    THUMBNAIL_WIDTH,
    execute,
    has_outputs,
    images,
    main,
    notebook_paths,
    strip,
    thumbnail,
)

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = notebook_paths(ROOT / "notebooks")
THUMBNAILS = ROOT / "docs" / "img" / "notebooks"


def test_the_six_notebooks_are_there_without_outputs() -> None:
    stems = [p.stem for p in NOTEBOOKS]
    assert stems[:6] == [
        "01_topologies",
        "02_catalog",
        "03_one_call",
        "04_gap",
        "05_jax_moe",
        "06_train_moe",
    ]
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        nbformat.validate(nb)
        assert not has_outputs(nb), (
            f"{path.name} keeps outputs: python -m variopath_jax.notebooks --strip"
        )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_and_ends_in_a_picture(path: Path) -> None:
    nb = execute(path, "small", timeout_s=120)
    assert images(nb), f"{path.name} draws nothing"
    last = next(c for c in reversed(nb.cells) if c.cell_type == "code")
    assert any("image/png" in out.get("data", {}) for out in last.outputs), path.name


def test_readme_links_every_notebook_and_its_thumbnail() -> None:
    readme = (ROOT / "README.md").read_text()
    for path in NOTEBOOKS:
        assert f"(notebooks/{path.name})" in readme, path.name
        thumb = THUMBNAILS / f"{path.stem}.png"
        assert f"(docs/img/notebooks/{thumb.name})" in readme, thumb.name
        with Image.open(thumb) as image:
            assert image.width == THUMBNAIL_WIDTH
        assert thumb.stat().st_size < 100_000


def test_strip_and_thumbnail(tmp_path: Path) -> None:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1 + 1")])
    buf = io.BytesIO()
    Image.new("RGB", (800, 400), "red").save(buf, format="PNG")
    png = base64.b64encode(buf.getvalue()).decode()
    nb.cells[0].outputs = [nbformat.v4.new_output("display_data", data={"image/png": png})]
    nb.cells[0].execution_count = 1
    path = tmp_path / "n.ipynb"
    nbformat.write(nb, path)
    assert images(nbformat.read(path, as_version=4)) == [buf.getvalue()]
    assert strip(path) and not strip(path)
    assert not has_outputs(nbformat.read(path, as_version=4))
    out = thumbnail(buf.getvalue(), tmp_path / "t" / "n.png", width=100)
    with Image.open(out) as image:
        assert image.size == (100, 50)


def test_main_runs_a_notebook_and_writes_its_thumbnail(tmp_path: Path, capsys) -> None:
    src = tmp_path / "tiny.ipynb"
    code = (
        "import os\nimport matplotlib.pyplot as plt\n"
        "plt.plot([0, 1]); plt.title(os.environ['VARIOPATH_NOTEBOOK_SIZE'])"
    )
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code)]), src)
    assert main([str(src), "--size", "small", "--thumbnails", str(tmp_path / "th"),
                 "--out", str(tmp_path / "out")]) == 0  # fmt: skip
    assert "tiny.ipynb" in capsys.readouterr().out
    assert (tmp_path / "th" / "tiny.png").is_file()
    ran = nbformat.read(tmp_path / "out" / "tiny.ipynb", as_version=4)
    assert "'small'" in ran.cells[0].outputs[0]["data"]["text/plain"]
    assert not has_outputs(nbformat.read(src, as_version=4))  # the source is left as it was
