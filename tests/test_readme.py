"""The README's example runs as written (in a fresh interpreter: it sets XLA_FLAGS itself)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path


def test_readme_example_runs(tmp_path) -> None:
    text = (Path(__file__).parent.parent / "README.md").read_text()
    block = re.search(r"## Using the op\n\n```python\n(.*?)```", text, re.S).group(1)
    script = tmp_path / "example.py"
    script.write_text(block)
    proc = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "(256, 4) [2 2 2 2 2 2 2 2]" in proc.stdout


def test_readme_moe_training_runs(tmp_path) -> None:
    """The README's MoE block, trained a few steps on 8 CPU devices: its loss falls."""
    text = (Path(__file__).parent.parent / "README.md").read_text()
    block = re.search(r"trained on 8 CPU devices:\n\n```python\n(.*?)```", text, re.S).group(1)
    script = tmp_path / "moe.py"
    script.write_text(block)
    proc = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    first, last = map(float, re.search(r"loss ([\d.]+) -> ([\d.]+)", proc.stdout).groups())
    assert last < first
    assert "leaked" not in proc.stderr
