"""The README's examples run as written (in a fresh interpreter: each sets XLA_FLAGS itself) and
end quietly: no nanobind leak report at exit (the native objects module-level caches hold are
freed first)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path


def run_readme_block(after: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """Run the README's python block that follows the text ``after`` (a regex) and a blank line."""
    text = (Path(__file__).parent.parent / "README.md").read_text()
    block = re.search(after + r"\n\n```python\n(.*?)```", text, re.S).group(1)
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
    assert "leaked" not in proc.stderr + proc.stdout, proc.stderr[-3000:]
    return proc


def test_readme_example_runs(tmp_path) -> None:
    proc = run_readme_block("## Using the op", tmp_path)
    assert "(256, 4) [2 2 2 2 2 2 2 2]" in proc.stdout


def test_readme_moe_training_runs(tmp_path) -> None:
    """The README's MoE block, trained a few steps on 8 CPU devices: its loss falls."""
    proc = run_readme_block("trained on 8 CPU devices:", tmp_path)
    first, last = map(float, re.search(r"loss ([\d.]+) -> ([\d.]+)", proc.stdout).groups())
    assert last < first
