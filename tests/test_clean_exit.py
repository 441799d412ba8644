"""Programs end quietly: the README's first example, run as a user runs it, prints no nanobind
leak report at exit (the native objects module-level caches hold are freed first)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path


def test_readme_first_example_exits_without_a_leak_report(tmp_path) -> None:
    text = (Path(__file__).parent.parent / "README.md").read_text()
    block = re.search(r"```python\n(.*?)```", text, re.S).group(1)  # the first example
    script = tmp_path / "first_example.py"
    script.write_text(block)
    proc = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={
            "PATH": "/usr/bin:/bin",
            "HOME": str(tmp_path),
            "XLA_FLAGS": "--xla_force_host_platform_device_count=8",
            "JAX_PLATFORMS": "cpu",
        },
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "leaked" not in proc.stderr + proc.stdout, proc.stderr[-3000:]
