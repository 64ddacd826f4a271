"""Build the one settings object: defaults < TOML file < TOKEN_GUARD_* environment < command-line flags.

`load_settings()` validates everything once; a bad value raises `SettingsError` naming the key, what was
expected and where the value came from. Nothing else in the package reads the environment or files for config.
"""

from __future__ import annotations

import logging
import os
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from proxy.settings import checks as v
from proxy.settings.keys import parse_keys
from proxy.settings.sections import (
    COUNT_SOURCES,
    OVERFLOW_POLICIES,
    REDIS_FAILURE_MODES,
    TOKENIZER_MODES,
    AdmissionSettings,
    CountingSettings,
    ExtprocSettings,
    ModelSettings,
    PolicySettings,
    RedisSettings,
    RenderSettings,
    ResponsesSettings,
    ServerSettings,
    Settings,
    UpstreamSettings,
)
from proxy.settings.spellings import (
    ENV_PREFIX,
    URL_KEYS,
    forget,
    one_url_key,
    rename,
    replica_urls,
    without_retired,
)

CONFIG_ENV = "TOKEN_GUARD_CONFIG"
TOOLING_PREFIXES = ("TOKEN_GUARD_E2E_", "TOKEN_GUARD_BENCH_")  # the test and bench harnesses' own variables
WORKER_SETUP = "TOKEN_GUARD_WORKER_SETUP"  # how `serve --workers N` hands its settings to its worker processes

log = logging.getLogger("token_guard.settings")


class SettingsError(ValueError):
    pass


SCHEMA: dict[str, dict[str, Callable[[Any], Any]]] = {
    "server": {
        "host": v.nonempty_text,
        "port": v.integer(1, 65535),
        "log_level": v.log_level,
        "log_format": v.choice("text", "json"),
        "api_keys": v.list_of(v.nonempty_text),
        "admin_api_keys": v.list_of(v.nonempty_text),
        "metrics_api_key": v.optional_text,
        "passthrough_paths": v.list_of(v.route_path),
        "max_body_bytes": v.integer(1024),
        "max_held_body_bytes": v.integer(1024),
        "max_json_depth": v.integer(8),
        "max_json_values": v.integer(1024),
        "max_messages": v.integer(1),
        "ready_wait_s": v.positive_float,
        "drain_timeout_s": v.positive_float,
        "read_timeout_s": v.positive_float,
        "write_timeout_s": v.positive_float,
        "workers": v.integer(1, 64),
    },
    "upstream": {
        "url": v.urls,  # the short spelling of urls (URL_KEYS)
        "urls": v.urls,
        "api_key": v.optional_text,
        "connect_timeout_s": v.positive_float,
        "first_byte_timeout_s": v.positive_float,
        "read_timeout_s": v.positive_float,
        "startup_wait_s": v.positive_float,
        "retries": v.integer(0),
        "health_interval_s": v.positive_float,
    },
    "admission": {
        "max_inflight_tokens": v.budget,
        "max_inflight_requests": v.integer(0),
        "queue_timeout_s": v.positive_float,
        "max_queue": v.integer(0),
        "background": v.choice("follow", "refuse"),
        "background_poll_s": v.positive_float,
        "background_max_s": v.positive_float,
    },
    "redis": {
        "url": v.redis_url,
        "failure": v.choice(*REDIS_FAILURE_MODES),
        "timeout_ms": v.integer(1, 60_000),
        "lease_s": v.lease_seconds,
        "block_share": v.fraction,
    },
    "responses": {
        "ttl_s": v.positive_float,
        "max_bytes": v.integer(0),
    },
    "policy": {
        "min_output_tokens": v.integer(1),
        "default_max_tokens": v.default_max_tokens,
        "on_overflow": v.choice(*OVERFLOW_POLICIES),
        "allow_client_override": v.boolean,
        "truncate_side": v.choice("left", "right", "middle"),
        "chunk_tokens": v.integer(16),
        "chunk_overlap": v.integer(0),
        "chunk_prompt": v.template("i", "n"),
        "chunk_separator": v.any_text,
        "chunk_merge": v.choice("concat", "reduce"),
        "max_fanout": v.integer(1),
        "next_turn_share_messages": v.fraction,
        "next_turn_share_responses": v.fraction,
        "next_turn_share_chat": v.fraction,
        "trust_request_chat_template": v.boolean,
        "reduce_prompt": v.template("answers"),
    },
    "extproc": {
        "port": v.integer(1, 65535),
        "chunk_instead": v.choice("reject", "truncate"),
        "picker_sets_destination": v.boolean,
        "path_prefixes": v.list_of(v.path_prefix),
    },
    "render": {
        "local": v.boolean,
        "cache_mb": v.non_negative_float,
        "only": v.boolean,
        "vllm_version": v.nonempty_text,
    },
    "counting": {
        "cache_mb": v.non_negative_float,
        "word_cache_mb": v.non_negative_float,
        "split_min_chars": v.integer(256),
        "source": v.choice(*COUNT_SOURCES),
    },
}
MODEL_SCHEMA: dict[str, Callable[[Any], Any]] = {
    "name": v.nonempty_text,
    "tokenizer": v.nonempty_text,
    "chat_template": v.path_value,
    "max_model_len": v.integer(1),
    "policy": lambda value: value,  # checked key by key against the policy schema in _model()
    "tokenizer_mode": v.choice(*TOKENIZER_MODES),
    "default_chat_template_kwargs": v.json_object,
    "reasoning_effort_map": v.effort_map,
    "count_source": v.choice(*COUNT_SOURCES),
}
SINGLE_MODEL_ENV = ("model", "tokenizer", "chat_template", "max_model_len", "tokenizer_mode",
                    "default_chat_template_kwargs", "reasoning_effort_map", "count_source")  # fmt: skip
SECTIONS = {
    "server": ServerSettings,
    "upstream": UpstreamSettings,
    "policy": PolicySettings,
    "counting": CountingSettings,
    "admission": AdmissionSettings,
    "redis": RedisSettings,
    "responses": ResponsesSettings,
    "extproc": ExtprocSettings,
    "render": RenderSettings,
}


@dataclass
class _Layer:
    """Raw values from one source, remembered with where they came from (for error messages)."""

    values: dict[str, dict[str, Any]] = field(default_factory=dict)
    origins: dict[str, str] = field(default_factory=dict)
    models: list[dict[str, Any]] | None = None
    keys: list[dict[str, Any]] | None = None  # [[keys]]: from the file only (secrets have no place in flags)
    keys_origin: str = "config"

    def put(self, section: str, key: str, value: Any, origin: str) -> None:
        self.values.setdefault(section, {})[key] = value
        self.origins[f"{section}.{key}"] = origin


def load_settings(
    flags: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
    config_file: Path | None = None,
) -> Settings:
    """Build and validate the settings. `flags` holds dotted keys ("upstream.urls") and "model.*" keys."""
    environ = os.environ if environ is None else environ
    flags = dict(flags or {})
    path = config_file or (Path(environ[CONFIG_ENV]) if environ.get(CONFIG_ENV) else None)
    layers = [_file_layer(path) if path else _Layer(), _env_layer(environ), _flag_layer(flags)]
    merged = _Layer()
    for layer in layers:
        try:
            rename(layer.values, layer.origins, _parsed)
        except ValueError as exc:
            raise SettingsError(str(exc)) from None
        if one_url_key(layer.values, layer.origins):
            forget(merged.values, merged.origins, URL_KEYS)
        for section, values in layer.values.items():
            for key, value in values.items():
                merged.put(section, key, value, layer.origins[f"{section}.{key}"])
        if layer.models is not None:
            merged.models = layer.models
        if layer.keys is not None:
            merged.keys, merged.keys_origin = layer.keys, layer.keys_origin
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
        elif section == "keys":
            if not isinstance(values, list) or not all(isinstance(k, dict) for k in values):
                raise SettingsError(f"keys: expected a list of [[keys]] tables (in {path})")
            layer.keys, layer.keys_origin = values, str(path)
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
        if not name.startswith(ENV_PREFIX) or name in (CONFIG_ENV, WORKER_SETUP) or name.startswith(TOOLING_PREFIXES):
            continue
        rest = name[len(ENV_PREFIX) :].lower()
        section, _, key = rest.partition("_")
        if section in SCHEMA and key:
            layer.put(section, key, value, name)
        elif rest in SINGLE_MODEL_ENV:
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
        flag = f"redis_{key}" if section == "redis" else key  # the [redis] keys' flags keep the section's name
        layer.put(section, key, value, "--" + flag.replace("_", "-"))
    if single:
        layer.models = [dict(single, _origin="--model/--tokenizer flags")]
    return layer


def _validate(merged: _Layer) -> Settings:
    sections: dict[str, Any] = {}
    for section, checks in SCHEMA.items():
        given = without_retired(section, merged.values.get(section, {}), merged.origins)
        unknown = set(given) - set(checks)
        if unknown:
            key = sorted(unknown)[0]
            raise SettingsError(
                f"{section}.{key}: unknown key (from {merged.origins[f'{section}.{key}']}); "
                f"expected one of {', '.join(checks)}"
            )
        parsed = {key: _check(f"{section}.{key}", checks[key], value, merged.origins) for key, value in given.items()}
        if section == "upstream":
            parsed = replica_urls(parsed)
        sections[section] = SECTIONS[section](**parsed)
    _check_policy(sections["policy"], "policy")
    _check_server(sections["server"])
    models = tuple(_model(i, m, sections["policy"]) for i, m in enumerate(merged.models or []))
    names = [m.name for m in models]
    if len(set(names)) != len(names):
        raise SettingsError(f"models: each name must be unique, got {names}")
    _check_render(sections["render"], models)
    try:
        keys = parse_keys(merged.keys or [], merged.keys_origin)
    except ValueError as exc:
        raise SettingsError(str(exc)) from None
    return Settings(models=models, keys=keys, **sections)


def _parsed(dotted: str, value: Any) -> Any:
    """`value` as the key's check reads it, so that two spellings of one value agree (the raw value if invalid)."""
    section, _, key = dotted.partition(".")
    try:
        return SCHEMA[section][key](value)
    except ValueError:
        return value


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


def _check_server(server: ServerSettings) -> None:
    if server.max_held_body_bytes < server.max_body_bytes:
        raise SettingsError(
            f"server.max_held_body_bytes: expected at least server.max_body_bytes ({server.max_body_bytes}), so that "
            f"the largest body fits, got {server.max_held_body_bytes}"
        )


def _check_render(render: RenderSettings, models: tuple[ModelSettings, ...]) -> None:
    """`token-guard render` asks no upstream: what it renders, and each window, must be configured."""
    if not render.only:
        return
    if not models:
        raise SettingsError("render.only: the render service asks no upstream, so [[models]] must name what it renders")
    for i, model in enumerate(models):
        if model.max_model_len is None:
            raise SettingsError(f"models[{i}].max_model_len: required with render.only (no upstream tells it)")


def _section_names() -> str:
    return ", ".join([*SCHEMA, "models", "keys"])
