"""One worker process of `token-guard serve --workers N`: uvicorn's supervisor binds the port, spawns N processes,
and each builds its own app here from the settings the command handed over (the same flags and config file, loaded
and validated again in the worker)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from proxy.counting.registry import ModelRegistry
from proxy.exchange.logs import configure_logging
from proxy.server.app import GuardApp, create_app
from proxy.server.running import freeze_heap
from proxy.settings import load_settings
from proxy.settings.loader import WORKER_SETUP


def handover(flags: dict[str, Any], config_file: Path | None) -> str:
    """What the command puts in the environment for its workers."""
    return json.dumps({"flags": flags, "config": str(config_file) if config_file else None})


def app() -> GuardApp:
    """uvicorn's app factory, called once in each worker process."""
    setup = json.loads(os.environ[WORKER_SETUP])
    config = Path(setup["config"]) if setup["config"] else None
    settings = load_settings(setup["flags"], config_file=config)
    configure_logging(settings.server.log_level, settings.server.log_format)
    built = create_app(settings, ModelRegistry.from_settings(settings.models, settings.counting))
    freeze_heap()
    return built
