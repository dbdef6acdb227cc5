"""`gptport serve --ray`'s options where no cluster starts: --ray without Ray installed, Ray's options
without --ray, and bad autoscaling bounds — each one line and exit 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.ray_cluster import needs_ray


def test_ray_option_without_ray_is_one_line(trained_dir: Path, tmp_path: Path) -> None:
    """With `import ray` failing, --ray is one line naming what to install, exit 2, no traceback."""
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "__init__.py").write_text("raise ImportError('no ray here')\n")
    r = subprocess.run([sys.executable, "-m", "gptport.cli.main", "serve", str(trained_dir), "--ray"],
                       capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().count("\n") == 0 and "Traceback" not in r.stderr, r.stderr
    assert "pip install" in r.stderr and "gptport[ray]" in r.stderr


def test_ray_options_need_ray(trained_dir: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "gptport.cli.main", "serve", str(trained_dir), "--replicas", "2"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--ray" in r.stderr and r.stderr.strip().count("\n") == 0, r.stderr


@needs_ray
def test_ray_autoscale_bounds_are_checked(trained_dir: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "gptport.cli.main", "serve", str(trained_dir), "--ray", "--autoscale",
                        "3:1"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--autoscale '3:1'" in r.stderr and r.stderr.strip().count("\n") == 0, r.stderr
