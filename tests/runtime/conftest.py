"""Fixtures the runtime tests share."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.cuda_models import with_cuda_graphs


@pytest.fixture(scope="session")
def cuda_dir(trained_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The trained model with export --cuda's graphs (written once for the device-slot and burst tests)."""
    return with_cuda_graphs(trained_dir, tmp_path_factory.mktemp("cuda") / "m")
