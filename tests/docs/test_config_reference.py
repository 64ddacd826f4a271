"""The configuration reference (docs/configuration.md) held against the settings code, so that the two cannot drift:
every key the loader accepts is documented with its default, environment variable and flags, and the page documents
no key the code does not know. The key lists come from the loader's own schemas, never from this file."""

from __future__ import annotations

import dataclasses
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

from proxy.cli import FLAGS
from proxy.settings.keys import KEY_SCHEMA
from proxy.settings.loader import MODEL_SCHEMA, SCHEMA, SECTIONS, SINGLE_MODEL_ENV
from proxy.settings.sections import KeySettings, ModelSettings
from proxy.settings.spellings import ENV_PREFIX, RENAMED, RETIRED

PAGE = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
HEADING = re.compile(r"^## `\[{1,2}([a-z_.]+)\]{1,2}`$")  # "## `[server]`", "## `[[models]]`"
RETIRED_HEADING = "## Retired keys"
RENAMED_HEADING = "## Renamed keys"
ENV_NAME = re.compile(r"`(TOKEN_GUARD_[A-Z_]+)`")
FLAG_NAME = re.compile(r"`(--[a-z][a-z-]*)`")
# `token-guard extproc --port` sets extproc.port instead of server.port (proxy/cli.py: main() hands flags_from a
# different target for --port); every other flag's key is the one cli.FLAGS names.
EXTPROC_PORT_FLAG = {"extproc.port": "--port"}

CODE_KEYS: dict[str, list[str]] = {
    **{s: list(keys) for s, keys in SCHEMA.items()},
    "models": list(MODEL_SCHEMA),
    "keys": list(KEY_SCHEMA),
}
DATACLASSES: dict[str, type[Any]] = {**SECTIONS, "models": ModelSettings, "keys": KeySettings}


@dataclasses.dataclass(frozen=True)
class Row:
    default: str
    names: str  # the "environment, flag" cell


def read_page() -> tuple[dict[str, dict[str, Row]], set[str], dict[str, str]]:
    """The documented keys by section (`[server]` -> "server", `[[models]]` -> "models"), the retired keys, and the
    renamed keys with their new names."""
    tables: dict[str, dict[str, Row]] = {}
    retired: set[str] = set()
    renamed: dict[str, str] = {}
    section: str | None = None
    for line in PAGE.read_text(encoding="utf-8").splitlines():
        if line.startswith("## "):
            match = HEADING.match(line)
            other = {RETIRED_HEADING: "retired", RENAMED_HEADING: "renamed"}
            section = match.group(1) if match else other.get(line)
            continue
        if section is None or not line.startswith("| `"):
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        key = cells[0].strip("`")
        if section == "retired":
            retired.add(key)
            continue
        if section == "renamed":
            renamed[key] = cells[1].strip("`")
            continue
        assert len(cells) == 5, f"docs/configuration.md: the row of {section}.{key} has {len(cells)} cells, not 5"
        assert key not in tables.get(section, {}), f"docs/configuration.md documents {section}.{key} twice"
        tables.setdefault(section, {})[key] = Row(default=cells[2], names=cells[3])
    return tables, retired, renamed


DOCUMENTED, DOCUMENTED_RETIRED, DOCUMENTED_RENAMED = read_page()
ALL_KEYS = [(section, key) for section, keys in CODE_KEYS.items() for key in keys]


def row(section: str, key: str) -> Row:
    found = DOCUMENTED.get(section, {}).get(key)
    assert found is not None, f"docs/configuration.md does not document {section}.{key} (add a row to its table)"
    return found


def test_the_page_documents_each_section() -> None:
    missing = sorted(set(CODE_KEYS) - set(DOCUMENTED))
    unknown = sorted(set(DOCUMENTED) - set(CODE_KEYS))
    assert not missing, f"docs/configuration.md has no table for the section(s) {missing}"
    assert not unknown, f"docs/configuration.md documents section(s) {unknown}, which the settings code does not know"


@pytest.mark.parametrize("section", sorted(CODE_KEYS))
def test_every_key_is_documented_and_no_other(section: str) -> None:
    code, page = set(CODE_KEYS[section]), set(DOCUMENTED.get(section, {}))
    missing = [f"{section}.{key}" for key in sorted(code - page)]
    unknown = [f"{section}.{key}" for key in sorted(page - code)]
    assert not missing, f"docs/configuration.md does not document {', '.join(missing)}"
    assert not unknown, f"docs/configuration.md documents {', '.join(unknown)}, which the settings code does not know"


def test_retired_keys_are_the_loaders() -> None:
    assert DOCUMENTED_RETIRED == set(RETIRED), (
        f"docs/configuration.md's retired keys {sorted(DOCUMENTED_RETIRED)} are not the loader's {sorted(RETIRED)}"
    )


def test_renamed_keys_are_the_loaders() -> None:
    assert DOCUMENTED_RENAMED == RENAMED, (
        f"docs/configuration.md's renamed keys {DOCUMENTED_RENAMED} are not the loader's {RENAMED}"
    )


def documented_default(cell: str) -> Any:
    """The default as the page writes it: a TOML literal in backticks, or the words "unset" or "required"."""
    for word in ("unset", "required"):
        if cell.startswith(word):
            return word
    literal = re.match(r"`([^`]*)`", cell)
    assert literal, f"not a default: {cell!r} (a TOML literal in backticks, unset or required)"
    return tomllib.loads(f"value = {literal.group(1)}")["value"]


def code_default(section: str, key: str) -> Any:
    """The dataclass field's default as the page should write it, or None when the key is not a field of its own."""
    fields = {f.name: f for f in dataclasses.fields(DATACLASSES[section])}
    if key not in fields:
        return None  # e.g. [[keys]] key: hashed into key_sha256
    field = fields[key]
    if field.default is not dataclasses.MISSING:
        default = field.default
    elif field.default_factory is not dataclasses.MISSING:
        default = field.default_factory()
    else:
        return "required"
    if default is None:
        return "unset"
    return list(default) if isinstance(default, tuple) else default


@pytest.mark.parametrize(("section", "key"), ALL_KEYS)
def test_documented_default_is_the_codes(section: str, key: str) -> None:
    expected = code_default(section, key)
    cell = row(section, key).default
    if expected is None:
        return
    if not isinstance(expected, str | int | float | bool | list):
        pytest.skip(f"{section}.{key}: a default of {type(expected).__name__} is not a simple value")
    shown = documented_default(cell)
    assert shown == expected and type(shown) is type(expected), (
        f"docs/configuration.md gives {section}.{key} the default {cell}, the settings code {expected!r}"
    )


def expected_env(section: str, key: str) -> set[str]:
    if section in SCHEMA:
        return {f"{ENV_PREFIX}{section.upper()}_{key.upper()}"}
    if section == "models":  # one model without a file: TOKEN_GUARD_MODEL, TOKEN_GUARD_TOKENIZER, ...
        return {ENV_PREFIX + name.upper() for name in SINGLE_MODEL_ENV if ("name" if name == "model" else name) == key}
    return set()  # [[keys]]: from the file only


@pytest.mark.parametrize(("section", "key"), ALL_KEYS)
def test_documented_environment_variable_is_the_loaders(section: str, key: str) -> None:
    shown = set(ENV_NAME.findall(row(section, key).names))
    assert shown == expected_env(section, key), (
        f"docs/configuration.md names {sorted(shown)} as {section}.{key}'s environment variable; "
        f"the loader reads {sorted(expected_env(section, key)) or 'none'}"
    )


def flag_keys() -> dict[str, set[str]]:
    """Each settings key (as "section.key") with the flags that set it."""
    flags: dict[str, set[str]] = {}
    for dest, target in FLAGS.items():
        section, _, key = target.partition(".")
        dotted = f"models.{key}" if section == "model" else target
        flags.setdefault(dotted, set()).add("--" + dest.replace("_", "-"))
    for dotted, flag in EXTPROC_PORT_FLAG.items():
        flags.setdefault(dotted, set()).add(flag)
    return flags


def test_every_flag_sets_a_known_key() -> None:
    known = {f"{section}.{key}" for section, key in ALL_KEYS}
    unknown = sorted(set(flag_keys()) - known)
    assert not unknown, f"proxy/cli.py's flags set {unknown}, which the settings schema does not know"


@pytest.mark.parametrize(("section", "key"), ALL_KEYS)
def test_documented_flags_are_the_clis(section: str, key: str) -> None:
    shown = set(FLAG_NAME.findall(row(section, key).names))
    expected = flag_keys().get(f"{section}.{key}", set())
    assert shown == expected, (
        f"docs/configuration.md names {sorted(shown) or 'no flag'} for {section}.{key}; "
        f"proxy/cli.py sets it with {sorted(expected) or 'no flag'}"
    )
