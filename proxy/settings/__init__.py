"""The one settings object, built once at start-up and passed in: its sections (sections.py), how it is loaded and
validated from defaults, a TOML file, the environment and flags (loader.py), keys spelled more than one way (renamed,
retired: spellings.py), and the value checkers (checks.py)."""

from proxy.settings.loader import SettingsError, load_settings
from proxy.settings.sections import (
    OVERFLOW_POLICIES,
    AdmissionSettings,
    CountingSettings,
    ExtprocSettings,
    ModelSettings,
    Overflow,
    PolicySettings,
    RedisSettings,
    RenderSettings,
    ResponsesSettings,
    ServerSettings,
    Settings,
    UpstreamSettings,
)

__all__ = [
    "OVERFLOW_POLICIES",
    "AdmissionSettings",
    "CountingSettings",
    "ExtprocSettings",
    "ModelSettings",
    "Overflow",
    "PolicySettings",
    "RedisSettings",
    "RenderSettings",
    "ResponsesSettings",
    "ServerSettings",
    "Settings",
    "SettingsError",
    "UpstreamSettings",
    "load_settings",
]
