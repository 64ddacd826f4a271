"""Every check test builds its settings from what it passes alone: none leak in from the environment."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True)
def no_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in os.environ:
        if name.startswith("TOKEN_GUARD_"):
            monkeypatch.delenv(name)
