"""Reading one sample from the guard's Prometheus text."""

from __future__ import annotations


def metric(text: str, name: str, **labels: str) -> float:
    """The value of `name` with these labels (others may be present); 0.0 when no sample matches."""
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            inside = line[line.find("{") + 1 : line.find("}")] if "{" in line else ""
            found = dict(part.split("=", 1) for part in inside.split(",") if part)
            if all(found.get(k) == f'"{v}"' for k, v in labels.items()):
                return float(line.rsplit(" ", 1)[1])
    return 0.0
