"""Reading Kubernetes manifests: a container's environment as the guard's settings would see it."""

from __future__ import annotations

from typing import Any


def env_of(c: dict[str, Any]) -> dict[str, str]:
    """The plain values; a key from a Secret is a stand-in value (its setting must still load)."""
    return {item["name"]: str(item["value"]) if "value" in item else "from-a-secret" for item in c.get("env", [])}
