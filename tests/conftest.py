from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from proxy.assets import write_demo_tokenizer_dir
from proxy.counting.text_count import TokenCounter
from proxy.counting.tokenizer import ModelTokenizer, load_tokenizer
from proxy.settings import CountingSettings
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


@pytest.fixture(scope="session")
def guard_tok(tokenizer_dir: Path) -> ModelTokenizer:
    """The guard's loading of `tokenizer_dir`."""
    return load_tokenizer(str(tokenizer_dir))


@pytest.fixture(scope="session")
def guard_counter(guard_tok: ModelTokenizer) -> TokenCounter:
    """A counter for `guard_tok` that caches nothing (what a caller without the model's counter gets), built once:
    its load-time self-checks cost a few hundred milliseconds on DeepSeek's vocabulary."""
    return TokenCounter(guard_tok.backend, CountingSettings(cache_mb=0), name=guard_tok.source)


@pytest.fixture(scope="session")
def reference(tokenizer_dir: Path) -> Any:
    """transformers' own loading of `tokenizer_dir`: the judge of every count."""
    return AutoTokenizer.from_pretrained(str(tokenizer_dir))
