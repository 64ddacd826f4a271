"""Reading Kubernetes manifests: a container's environment as the guard's settings would see it."""

from __future__ import annotations

from typing import Any


def env_of(c: dict[str, Any]) -> dict[str, str]:
    """The plain values; a key from a Secret is a stand-in value (its setting must still load)."""
    return {item["name"]: str(item["value"]) if "value" in item else "from-a-secret" for item in c.get("env", [])}


def pre_stop_s(c: dict[str, Any]) -> float:
    """How long a container's preStop hook pauses before its SIGTERM (`sleep N`, or Kubernetes' own sleep action)."""
    hook = c.get("lifecycle", {}).get("preStop", {})
    if "sleep" in hook:
        return float(hook["sleep"]["seconds"])
    command = hook.get("exec", {}).get("command", [])
    return float(command[1]) if command[:1] == ["sleep"] else 0.0


def grace_s(pod: dict[str, Any]) -> float:
    """The pod's grace period: from the preStop hook's start to SIGKILL (Kubernetes' default 30 s)."""
    return float(pod.get("terminationGracePeriodSeconds", 30))


def named_port(c: dict[str, Any], port: int | str) -> int:
    """A container's port by number or by the name its `ports` give it."""
    if isinstance(port, int):
        return port
    (number,) = [p["containerPort"] for p in c["ports"] if p["name"] == port]
    assert isinstance(number, int)
    return number
