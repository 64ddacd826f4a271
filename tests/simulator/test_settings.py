"""Settings validation and the `simulate` command's arguments."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from simulator import SimulatorSettings
from simulator.command import add_arguments


def test_profile_must_be_supported(tmp_path: Path) -> None:
    supported = r"supported profiles: 0\.31, 0\.32, 0\.33, 0\.34"
    with pytest.raises(ValueError, match=r"unknown vLLM profile '0\.9'; " + supported):
        SimulatorSettings(tokenizer=tmp_path, profile="0.9")


def test_other_settings_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        SimulatorSettings(tokenizer=tmp_path, max_model_len=0)
    with pytest.raises(ValueError):
        SimulatorSettings(tokenizer=tmp_path, itl_s=-1)


def test_version_and_root_defaults(tmp_path: Path) -> None:
    settings = SimulatorSettings(tokenizer=tmp_path, profile="0.31")
    assert settings.vllm_version == "0.31.0" and settings.model_root == str(tmp_path)
    assert SimulatorSettings(tokenizer=tmp_path, version="9.9.9", root="r").vllm_version == "9.9.9"


def test_command_arguments() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    defaults = parser.parse_args([])
    assert (defaults.host, defaults.port, defaults.profile, defaults.model) == ("127.0.0.1", 8001, "0.32", "tiny")
    assert defaults.tokenizer is None and defaults.ttft == 0.0 and defaults.itl == 0.0
    args = parser.parse_args(["--profile", "0.31", "--max-model-len", "512", "--itl", "0.01", "--tokenizer", "t"])
    assert (args.profile, args.max_model_len, args.itl, args.tokenizer) == ("0.31", 512, 0.01, Path("t"))
    with pytest.raises(SystemExit):
        parser.parse_args(["--profile", "0.20"])
