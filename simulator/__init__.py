"""A deterministic, fast stand-in for a vLLM OpenAI-compatible server: same wire shapes, same token counts,
same context-length rules per vLLM release, fake tokens paced by configurable latencies."""

from __future__ import annotations

from simulator.app import create_app
from simulator.settings import SimulatorSettings
from simulator.stats import SimulatorStats

__all__ = ["SimulatorSettings", "SimulatorStats", "create_app"]
