"""Reading the project's Dockerfile as Docker does: instructions in order, continuation lines joined, comments
dropped, grouped by build stage; the final stage's environment, user and health check."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

DOCKERFILE = Path(__file__).resolve().parents[2] / "Dockerfile"


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined and comments dropped."""
    found: list[tuple[str, str]] = []
    current = ""
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        name, _, args = (current + stripped).partition(" ")
        found.append((name.upper(), args.strip()))
        current = ""
    return found


def stages() -> list[list[tuple[str, str]]]:
    """The instructions of each build stage, in order (each list starts with its FROM)."""
    result: list[list[tuple[str, str]]] = []
    for instruction in instructions(DOCKERFILE.read_text()):
        if instruction[0] == "FROM":
            result.append([])
        result[-1].append(instruction)
    return result


def final() -> dict[str, list[str]]:
    """The final stage's arguments by instruction."""
    by_name: dict[str, list[str]] = {}
    for name, args in stages()[-1]:
        by_name.setdefault(name, []).append(args)
    return by_name


def image_env() -> dict[str, str]:
    return dict(item.split("=", 1) for args in final()["ENV"] for item in shlex.split(args))


def exec_form(args: str) -> list[str]:
    parsed = json.loads(args)
    assert isinstance(parsed, list) and all(isinstance(a, str) for a in parsed), f"not the exec form: {args}"
    return parsed


def healthcheck() -> tuple[str, list[str]]:
    (args,) = final()["HEALTHCHECK"]
    options, _, command = args.partition(" CMD ")
    return options, exec_form(command)


def image_user() -> str:
    (user,) = final()["USER"]
    return user
