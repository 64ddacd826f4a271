from __future__ import annotations

from pathlib import Path

import pytest

from proxy.assets import write_demo_tokenizer_dir
from tests.support.trained import write_trained_tokenizer_dir


@pytest.fixture(scope="session")
def deepseek_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_demo_tokenizer_dir(tmp_path_factory.mktemp("deepseek"))


@pytest.fixture(scope="session")
def chatml_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_trained_tokenizer_dir(tmp_path_factory.mktemp("chatml"))


@pytest.fixture(scope="session", params=["deepseek", "chatml"])
def tokenizer_dir(request: pytest.FixtureRequest) -> Path:
    path: Path = request.getfixturevalue(f"{request.param}_dir")
    return path
