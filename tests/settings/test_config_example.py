from __future__ import annotations

from pathlib import Path

from proxy.settings import Settings, load_settings

ROOT = Path(__file__).resolve().parents[2]


def test_config_example_loads_and_shows_the_defaults() -> None:
    assert load_settings({}, environ={}, config_file=ROOT / "config.example.toml") == Settings()
