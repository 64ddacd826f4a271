"""The one settings object: defaults < TOML file < TOKEN_GUARD_* environment < command-line flags.

`load_settings()` validates everything once; a bad value raises `SettingsError` naming the key, what was
expected and where the value came from. Nothing else in the package reads the environment or files for config.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

CONFIG_ENV = "TOKEN_GUARD_CONFIG"
ENV_PREFIX = "TOKEN_GUARD_"
TOOLING_PREFIXES = ("TOKEN_GUARD_E2E_", "TOKEN_GUARD_BENCH_")  # the test and bench harnesses' own variables


class SettingsError(ValueError):
    pass


@dataclass(frozen=True)
class ServerSettings:
    host: str = "127.0.0.1"
    port: int = 8080
    log_level: str = "info"
    log_format: str = "text"
    api_keys: tuple[str, ...] = ()
    max_body_bytes: int = 32 * 2**20
    max_json_depth: int = 64
    max_messages: int = 10_000
    drain_timeout_s: float = 30.0


@dataclass(frozen=True)
class UpstreamSettings:
    url: str = "http://127.0.0.1:8000"
    urls: tuple[str, ...] = ()  # replicas of the same model; when set, `url` is not used for traffic
    api_key: str | None = None
    connect_timeout_s: float = 5.0
    first_byte_timeout_s: float = 600.0
    read_timeout_s: float = 600.0  # the longest silence allowed between two chunks of an answer
    write_timeout_s: float = 60.0
    startup_wait_s: float = 300.0
    retries: int = 2
    health_interval_s: float = 5.0

    @property
    def replicas(self) -> tuple[str, ...]:
        return self.urls or (self.url,)


@dataclass(frozen=True)
class AdmissionSettings:
    max_inflight_tokens: int | str = 0  # 0: off; "auto": from the upstream's KV cache size
    max_inflight_requests: int = 0
    queue_timeout_s: float = 30.0
    max_queue: int = 1000


OVERFLOW_POLICIES = ("reject", "truncate", "chunk")


@dataclass(frozen=True)
class PolicySettings:
    min_output_tokens: int = 1
    default_max_tokens: int | str | None = None
    on_overflow: str = "reject"
    allow_client_override: bool = True
    truncate_side: str = "left"
    chunk_tokens: int = 2048
    chunk_overlap: int = 0
    chunk_prompt: str | None = None
    chunk_separator: str = "\n\n"
    chunk_merge: str = "concat"
    max_fanout: int = 4
    reduce_prompt: str = (
        "Below are answers to consecutive parts of one long input. Combine them into a single answer.\n\n{answers}"
    )


@dataclass(frozen=True)
class CountingSettings:
    cache_mb: float = 64.0
    split_min_chars: int = 16384


@dataclass(frozen=True)
class ModelSettings:
    name: str
    tokenizer: str
    chat_template: Path | None = None
    max_model_len: int | None = None
    policy: PolicySettings | None = None  # the global policy with this model's [models.policy] overrides


@dataclass(frozen=True)
class Settings:
    server: ServerSettings = field(default_factory=ServerSettings)
    upstream: UpstreamSettings = field(default_factory=UpstreamSettings)
    policy: PolicySettings = field(default_factory=PolicySettings)
    counting: CountingSettings = field(default_factory=CountingSettings)
    admission: AdmissionSettings = field(default_factory=AdmissionSettings)
    models: tuple[ModelSettings, ...] = ()


# --- value checkers: each returns the parsed value or raises ValueError with what was expected ---


def _int(low: int, high: int | None = None) -> Callable[[Any], int]:
    expected = f"an integer from {low} to {high}" if high else f"an integer >= {low}"

    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int | str):
            raise ValueError(expected)
        try:
            number = int(value)
        except ValueError:
            raise ValueError(expected) from None
        if number < low or (high is not None and number > high):
            raise ValueError(expected)
        return number

    return check


def _positive_float(value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError("a number of seconds > 0") from None
    if isinstance(value, bool) or not number > 0:
        raise ValueError("a number of seconds > 0")
    return number


def _non_negative_float(value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError("a number >= 0") from None
    if isinstance(value, bool) or not number >= 0:
        raise ValueError("a number >= 0")
    return number


def _text(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError("a non-empty string")
    return value.strip()


def _url(value: Any) -> str:
    text = _text(value)
    if not re.match(r"^https?://[^/\s]+", text):
        raise ValueError("an http:// or https:// URL")
    return text.rstrip("/")


def _log_level(value: Any) -> str:
    levels = ("critical", "error", "warning", "info", "debug")
    if not isinstance(value, str) or value.lower() not in levels:
        raise ValueError("one of " + ", ".join(levels))
    return value.lower()


def _default_max_tokens(value: Any) -> int | str | None:
    if value is None or value == "":
        return None
    if isinstance(value, str) and value.strip().endswith("%"):
        try:
            percent = float(value.strip()[:-1])
        except ValueError:
            raise ValueError('a token count or a percentage of the window such as "50%"') from None
        if not 0 < percent <= 100:
            raise ValueError("a percentage above 0% and at most 100%")
        return value.strip()
    try:
        return _int(1)(value)
    except ValueError:
        raise ValueError('a token count >= 1 or a percentage of the window such as "50%"') from None


def _choice(*options: str) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if not isinstance(value, str) or value not in options:
            raise ValueError("one of " + ", ".join(repr(o) for o in options))
        return value

    return check


def _bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "1", "yes", "on", "false", "0", "no", "off"):
        return value.lower() in ("true", "1", "yes", "on")
    raise ValueError("true or false")


def _any_text(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError("a string")
    return value


def _template(*fields: str) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        text = _any_text(value)
        try:
            text.format(**{f: 1 for f in fields})
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(f"a template using only {', '.join('{' + f + '}' for f in fields)} ({exc!r})") from None
        return text

    return check


def _list_of(check: Callable[[Any], Any]) -> Callable[[Any], tuple[Any, ...]]:
    def parse(value: Any) -> tuple[Any, ...]:
        items = [v.strip() for v in value.split(",") if v.strip()] if isinstance(value, str) else value
        if not isinstance(items, list | tuple):
            raise ValueError("a list (or a comma-separated string)")
        try:
            return tuple(check(item) for item in items)
        except ValueError as exc:
            raise ValueError(f"a list of {exc}") from None

    return parse


def _optional_text(value: Any) -> str | None:
    return None if value in (None, "") else _text(value)


def _budget(value: Any) -> int | str:
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    try:
        return _int(0)(value)
    except ValueError:
        raise ValueError('a token count >= 0 (0 = off) or "auto"') from None


def _path(value: Any) -> Path:
    return Path(_text(value)).expanduser()


SCHEMA: dict[str, dict[str, Callable[[Any], Any]]] = {
    "server": {
        "host": _text,
        "port": _int(1, 65535),
        "log_level": _log_level,
        "log_format": _choice("text", "json"),
        "api_keys": _list_of(_text),
        "max_body_bytes": _int(1024),
        "max_json_depth": _int(8),
        "max_messages": _int(1),
        "drain_timeout_s": _positive_float,
    },
    "upstream": {
        "url": _url,
        "urls": _list_of(_url),
        "api_key": _optional_text,
        "connect_timeout_s": _positive_float,
        "first_byte_timeout_s": _positive_float,
        "read_timeout_s": _positive_float,
        "write_timeout_s": _positive_float,
        "startup_wait_s": _positive_float,
        "retries": _int(0),
        "health_interval_s": _positive_float,
    },
    "admission": {
        "max_inflight_tokens": _budget,
        "max_inflight_requests": _int(0),
        "queue_timeout_s": _positive_float,
        "max_queue": _int(0),
    },
    "policy": {
        "min_output_tokens": _int(1),
        "default_max_tokens": _default_max_tokens,
        "on_overflow": _choice(*OVERFLOW_POLICIES),
        "allow_client_override": _bool,
        "truncate_side": _choice("left", "right", "middle"),
        "chunk_tokens": _int(16),
        "chunk_overlap": _int(0),
        "chunk_prompt": _template("i", "n"),
        "chunk_separator": _any_text,
        "chunk_merge": _choice("concat", "reduce"),
        "max_fanout": _int(1),
        "reduce_prompt": _template("answers"),
    },
    "counting": {"cache_mb": _non_negative_float, "split_min_chars": _int(256)},
}
MODEL_SCHEMA: dict[str, Callable[[Any], Any]] = {
    "name": _text,
    "tokenizer": _text,
    "chat_template": _path,
    "max_model_len": _int(1),
    "policy": lambda value: value,  # checked key by key against the policy schema in _model()
}
SECTIONS = {
    "server": ServerSettings,
    "upstream": UpstreamSettings,
    "policy": PolicySettings,
    "counting": CountingSettings,
    "admission": AdmissionSettings,
}


@dataclass
class _Layer:
    """Raw values from one source, remembered with where they came from (for error messages)."""

    values: dict[str, dict[str, Any]] = field(default_factory=dict)
    origins: dict[str, str] = field(default_factory=dict)
    models: list[dict[str, Any]] | None = None

    def put(self, section: str, key: str, value: Any, origin: str) -> None:
        self.values.setdefault(section, {})[key] = value
        self.origins[f"{section}.{key}"] = origin


def load_settings(
    flags: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
    config_file: Path | None = None,
) -> Settings:
    """Build and validate the settings. `flags` holds dotted keys ("upstream.url") and "model.*" keys."""
    environ = os.environ if environ is None else environ
    flags = dict(flags or {})
    path = config_file or (Path(environ[CONFIG_ENV]) if environ.get(CONFIG_ENV) else None)
    layers = [_file_layer(path) if path else _Layer(), _env_layer(environ), _flag_layer(flags)]
    merged = _Layer()
    for layer in layers:
        for section, values in layer.values.items():
            for key, value in values.items():
                merged.put(section, key, value, layer.origins[f"{section}.{key}"])
        if layer.models is not None:
            merged.models = layer.models
    return _validate(merged)


def _file_layer(path: Path) -> _Layer:
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise SettingsError(f"config file {path}: cannot be read ({exc.strerror or exc})") from exc
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError(f"config file {path}: not valid TOML ({exc})") from exc
    layer = _Layer()
    for section, values in data.items():
        if section == "models":
            if not isinstance(values, list) or not all(isinstance(m, dict) for m in values):
                raise SettingsError(f"models: expected a list of [[models]] tables (in {path})")
            layer.models = [dict(m, _origin=str(path)) for m in values]
        elif section in SCHEMA and isinstance(values, dict):
            for key, value in values.items():
                layer.put(section, key, value, str(path))
        else:
            raise SettingsError(f"{section}: unknown section (in {path}); expected one of {_section_names()}")
    return layer


def _env_layer(environ: Mapping[str, str]) -> _Layer:
    layer = _Layer()
    single: dict[str, Any] = {}
    for name, value in environ.items():
        if not name.startswith(ENV_PREFIX) or name == CONFIG_ENV or name.startswith(TOOLING_PREFIXES):
            continue
        rest = name[len(ENV_PREFIX) :].lower()
        section, _, key = rest.partition("_")
        if section in SCHEMA and key:
            layer.put(section, key, value, name)
        elif rest in ("model", "tokenizer", "chat_template", "max_model_len"):
            single["name" if rest == "model" else rest] = value
        else:
            raise SettingsError(f"{name}: unknown setting; expected TOKEN_GUARD_<SECTION>_<KEY> for {_section_names()}")
    if single:
        layer.models = [dict(single, _origin="TOKEN_GUARD_MODEL/TOKENIZER environment")]
    return layer


def _flag_layer(flags: Mapping[str, Any]) -> _Layer:
    layer = _Layer()
    single = {k.removeprefix("model."): v for k, v in flags.items() if k.startswith("model.") and v is not None}
    for dotted, value in flags.items():
        if value is None or dotted.startswith("model."):
            continue
        section, _, key = dotted.partition(".")
        layer.put(section, key, value, "--" + key.replace("_", "-"))
    if single:
        layer.models = [dict(single, _origin="--model/--tokenizer flags")]
    return layer


def _validate(merged: _Layer) -> Settings:
    sections: dict[str, Any] = {}
    for section, checks in SCHEMA.items():
        given = merged.values.get(section, {})
        unknown = set(given) - set(checks)
        if unknown:
            key = sorted(unknown)[0]
            raise SettingsError(
                f"{section}.{key}: unknown key (from {merged.origins[f'{section}.{key}']}); "
                f"expected one of {', '.join(checks)}"
            )
        parsed = {key: _check(f"{section}.{key}", checks[key], value, merged.origins) for key, value in given.items()}
        sections[section] = SECTIONS[section](**parsed)
    _check_policy(sections["policy"], "policy")
    models = tuple(_model(i, m, sections["policy"]) for i, m in enumerate(merged.models or []))
    names = [m.name for m in models]
    if len(set(names)) != len(names):
        raise SettingsError(f"models: each name must be unique, got {names}")
    return Settings(models=models, **sections)


def _check(key: str, check: Callable[[Any], Any], value: Any, origins: Mapping[str, str]) -> Any:
    try:
        return check(value)
    except ValueError as exc:
        raise SettingsError(f"{key}: expected {exc}, got {value!r} (from {origins.get(key, 'defaults')})") from None


def _model(index: int, raw: dict[str, Any], policy: PolicySettings) -> ModelSettings:
    origin = raw.pop("_origin", "config")
    overrides = raw.pop("policy", None)
    where = {f"models[{index}].{k}": origin for k in MODEL_SCHEMA}
    unknown = set(raw) - set(MODEL_SCHEMA)
    if unknown:
        raise SettingsError(f"models[{index}].{sorted(unknown)[0]}: unknown key (from {origin})")
    for required in ("name", "tokenizer"):
        if raw.get(required) in (None, ""):
            raise SettingsError(f"models[{index}].{required}: required (from {origin})")
    parsed = {k: _check(f"models[{index}].{k}", MODEL_SCHEMA[k], v, where) for k, v in raw.items() if v is not None}
    if overrides is not None:
        parsed["policy"] = _model_policy(index, overrides, policy, origin)
    return ModelSettings(**parsed)


def _model_policy(index: int, overrides: Any, policy: PolicySettings, origin: str) -> PolicySettings:
    key = f"models[{index}].policy"
    if not isinstance(overrides, dict):
        raise SettingsError(f"{key}: expected a table of policy keys (from {origin})")
    checks = SCHEMA["policy"]
    unknown = set(overrides) - set(checks)
    if unknown:
        raise SettingsError(
            f"{key}.{sorted(unknown)[0]}: unknown key (from {origin}); expected one of {', '.join(checks)}"
        )
    where = {f"{key}.{k}": origin for k in overrides}
    parsed = {k: _check(f"{key}.{k}", checks[k], v, where) for k, v in overrides.items()}
    merged = replace(policy, **parsed)
    _check_policy(merged, key)
    return merged


def _check_policy(policy: PolicySettings, key: str) -> None:
    if policy.chunk_overlap >= policy.chunk_tokens // 2:
        raise SettingsError(
            f"{key}.chunk_overlap: expected fewer than half of chunk_tokens ({policy.chunk_tokens}), "
            f"got {policy.chunk_overlap}"
        )


def _section_names() -> str:
    return ", ".join([*SCHEMA, "models"])
