"""One settings object: defaults < TOML file < environment < flags, validated once with messages naming the key."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from proxy.policy.decide import next_turn_share
from proxy.settings import Settings, SettingsError, load_settings


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "tg.toml"
    path.write_text(text)
    return path


def test_defaults() -> None:
    settings = load_settings({}, environ={})
    assert settings == Settings()
    assert settings.server.port == 8080 and settings.models == ()


def test_layers_rise_in_priority(tmp_path: Path) -> None:
    config = write(tmp_path, '[server]\nport = 9001\nhost = "0.0.0.0"\n[upstream]\nurl = "http://file:1"\n')
    env = {"TOKEN_GUARD_SERVER_PORT": "9002", "TOKEN_GUARD_UPSTREAM_URL": "http://env:2"}
    settings = load_settings({"upstream.url": "http://flag:3"}, environ=env, config_file=config)
    assert settings.server.host == "0.0.0.0"  # file
    assert settings.server.port == 9002  # env over file
    assert settings.upstream.urls == ("http://flag:3",)  # flag over env


def test_config_file_from_environment_and_models_table(tmp_path: Path) -> None:
    config = write(
        tmp_path,
        '[[models]]\nname = "a"\ntokenizer = "/tok/a"\nmax_model_len = 4096\n'
        '[[models]]\nname = "b"\ntokenizer = "org/b"\nchat_template = "/t.jinja"\n',
    )
    settings = load_settings({}, environ={"TOKEN_GUARD_CONFIG": str(config)})
    assert [(m.name, m.tokenizer, m.max_model_len) for m in settings.models] == [
        ("a", "/tok/a", 4096),
        ("b", "org/b", None),
    ]
    assert settings.models[1].chat_template == Path("/t.jinja")


def test_single_model_from_flags_replaces_file_models(tmp_path: Path) -> None:
    config = write(tmp_path, '[[models]]\nname = "a"\ntokenizer = "/tok/a"\n')
    flags = {"model.name": "tiny", "model.tokenizer": "/m", "model.max_model_len": "2048"}
    settings = load_settings(flags, environ={}, config_file=config)
    assert [(m.name, m.max_model_len) for m in settings.models] == [("tiny", 2048)]


def test_single_model_from_environment() -> None:
    env = {"TOKEN_GUARD_MODEL": "tiny", "TOKEN_GUARD_TOKENIZER": "/m", "TOKEN_GUARD_MAX_MODEL_LEN": "512"}
    assert load_settings({}, environ=env).models[0].max_model_len == 512


@pytest.mark.parametrize(
    "env,message",
    [
        ({"TOKEN_GUARD_SERVER_PORT": "http"}, "server.port: expected an integer from 1 to 65535, got 'http' "
                                              "(from TOKEN_GUARD_SERVER_PORT)"),
        ({"TOKEN_GUARD_SERVER_PORT": "70000"}, "server.port: expected an integer from 1 to 65535"),
        ({"TOKEN_GUARD_UPSTREAM_URL": "localhost:8000"}, "upstream.url: expected an http:// or https:// URL"),
        ({"TOKEN_GUARD_UPSTREAM_READ_TIMEOUT_S": "-1"}, "upstream.read_timeout_s: expected a number of seconds > 0"),
        ({"TOKEN_GUARD_SERVER_WRITE_TIMEOUT_S": "0"}, "server.write_timeout_s: expected a number of seconds > 0"),
        ({"TOKEN_GUARD_POLICY_DEFAULT_MAX_TOKENS": "lots"}, "policy.default_max_tokens: expected a token count"),
        ({"TOKEN_GUARD_POLICY_MIN_OUTPUT_TOKENS": "0"}, "policy.min_output_tokens: expected an integer >= 1"),
        ({"TOKEN_GUARD_REDIS_BLOCK_SHARE": "1.5"}, "redis.block_share: expected a number from 0 to 1"),
        ({"TOKEN_GUARD_ADMISSION_REDIS_BLOCK_SHARE": "half"}, "redis.block_share: expected a number from 0 to 1, got "
                                                              "'half' (from TOKEN_GUARD_ADMISSION_REDIS_BLOCK_SHARE)"),
        ({"TOKEN_GUARD_SERVER_LOG_LEVEL": "loud"}, "server.log_level: expected one of critical"),
        ({"TOKEN_GUARD_SERVER_COLOUR": "red"}, "server.colour: unknown key (from TOKEN_GUARD_SERVER_COLOUR)"),
        ({"TOKEN_GUARD_MAX_MODEL_LEN": "10"}, "models[0].name: required"),
        ({"TOKEN_GUARD_SERVER_MAX_HELD_BODY_BYTES": "1048576"}, "server.max_held_body_bytes: expected at least "
                                                                "server.max_body_bytes (33554432)"),
    ],
)  # fmt: skip
def test_bad_values_name_the_key_and_the_source(env: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError) as info:
        load_settings({}, environ=env)
    assert message in str(info.value)


@pytest.mark.parametrize(
    "text,message",
    [
        ("[server\n", "not valid TOML"),
        ("[nope]\nx = 1\n", "nope: unknown section"),
        ('[[models]]\nname = "a"\n', "models[0].tokenizer: required"),
        ('[[models]]\nname = "a"\ntokenizer = "t"\nmax_model_len = "big"\n', "models[0].max_model_len: expected"),
        ('[[models]]\nname = "a"\ntokenizer = "t"\n[[models]]\nname = "a"\ntokenizer = "u"\n', "unique"),
    ],
)
def test_bad_files(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(SettingsError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_settings({}, environ={}, config_file=write(tmp_path, text))


def test_a_retired_key_still_loads_with_a_warning_that_names_its_successor(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = write(tmp_path, "[upstream]\nwrite_timeout_s = 60.0\n[server]\nwrite_timeout_s = 5.0\n")
    settings = load_settings({}, environ={}, config_file=config)
    assert settings.server.write_timeout_s == 5.0
    (warning,) = [r for r in caplog.records if r.levelname == "WARNING"]
    assert "upstream.write_timeout_s" in warning.getMessage() and "server.write_timeout_s" in warning.getMessage()
    assert load_settings({}, environ={"TOKEN_GUARD_UPSTREAM_WRITE_TIMEOUT_S": "60"}) == Settings()


def test_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="cannot be read"):
        load_settings({}, environ={}, config_file=tmp_path / "absent.toml")


def test_per_model_policy_overrides_the_global_one(tmp_path: Path) -> None:
    config = write(
        tmp_path,
        '[policy]\non_overflow = "truncate"\nmax_fanout = 2\n'
        '[[models]]\nname = "a"\ntokenizer = "/a"\n[models.policy]\non_overflow = "chunk"\n'
        '[[models]]\nname = "b"\ntokenizer = "/b"\n',
    )
    settings = load_settings({}, environ={}, config_file=config)
    first, second = settings.models
    assert first.policy is not None and (first.policy.on_overflow, first.policy.max_fanout) == ("chunk", 2)
    assert second.policy is None and settings.policy.on_overflow == "truncate"


@pytest.mark.parametrize(
    "text,message",
    [
        ('[policy]\non_overflow = "summarise"\n', "policy.on_overflow: expected one of 'reject', 'truncate', 'chunk'"),
        ("[policy]\nchunk_overlap = 1500\n", "policy.chunk_overlap: expected fewer than half of chunk_tokens (2048)"),
        ('[policy]\nchunk_prompt = "Part {k}"\n', "policy.chunk_prompt: expected a template using only {i}, {n}"),
        (
            '[[models]]\nname = "a"\ntokenizer = "t"\n[models.policy]\nmax_fanout = 0\n',
            "models[0].policy.max_fanout",
        ),
        ('[[models]]\nname = "a"\ntokenizer = "t"\n[models.policy]\ncolour = 1\n', "unknown key"),
    ],
)
def test_bad_policy_values(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(SettingsError) as info:
        load_settings({}, environ={}, config_file=write(tmp_path, text))
    assert message in str(info.value)


def test_the_harnesses_own_variables_are_not_settings() -> None:
    env = {"TOKEN_GUARD_E2E_CACHE": "/tmp/x", "TOKEN_GUARD_BENCH_ROUNDS": "3"}
    assert load_settings({}, environ=env) == Settings()


def test_how_a_model_is_counted(tmp_path: Path) -> None:
    """tokenizer_mode and default_chat_template_kwargs as vLLM's flags take them; who counts, globally and per model."""
    path = write(tmp_path, '[counting]\nsource = "upstream"\n[[models]]\nname = "a"\ntokenizer = "/a"\n'
                           'tokenizer_mode = "mistral"\ndefault_chat_template_kwargs = { enable_thinking = false }\n'
                           'count_source = "local"\n')  # fmt: skip
    settings = load_settings({}, environ={}, config_file=path)
    (model,) = settings.models
    assert settings.counting.source == "upstream"
    assert (model.tokenizer_mode, model.default_chat_template_kwargs, model.count_source) == (
        "mistral", {"enable_thinking": False}, "local",
    )  # fmt: skip
    flags = {"model.name": "b", "model.tokenizer": "/b", "model.default_chat_template_kwargs": '{"thinking": true}'}
    assert load_settings(flags, environ={}).models[0].default_chat_template_kwargs == {"thinking": True}
    env = {"TOKEN_GUARD_MODEL": "c", "TOKEN_GUARD_TOKENIZER": "/c", "TOKEN_GUARD_TOKENIZER_MODE": "hf"}
    assert load_settings({}, environ=env).models[0].tokenizer_mode == "hf"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"TOKEN_GUARD_COUNTING_SOURCE": "vllm"}, "counting.source: expected one of 'auto', 'local', 'upstream'"),
        ({"TOKEN_GUARD_TOKENIZER_MODE": "slow"}, "models[0].tokenizer_mode: expected one of 'auto', 'hf', 'mistral'"),
        ({"TOKEN_GUARD_DEFAULT_CHAT_TEMPLATE_KWARGS": "[1]"}, "models[0].default_chat_template_kwargs: expected a "
                                                               "table (TOML) or a JSON object"),
    ],
)  # fmt: skip
def test_bad_counting_values(env: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError, match=re.escape(message)):
        load_settings({}, environ={"TOKEN_GUARD_MODEL": "m", "TOKEN_GUARD_TOKENIZER": "/m", **env})


@pytest.mark.parametrize(("value", "share"), [("0", 0.0), ("0.25", 0.25), ("1", 1.0)])
def test_the_block_share_is_a_fraction(value: str, share: float) -> None:
    env = {"TOKEN_GUARD_MODEL": "m", "TOKEN_GUARD_TOKENIZER": "/m", "TOKEN_GUARD_REDIS_BLOCK_SHARE": value}
    assert load_settings({}, environ=env).redis.block_share == share


A, B, C = "http://a:1", "http://b:2", "http://c:3"


@pytest.mark.parametrize(
    ("text", "env", "flags", "urls"),
    [
        ("", {}, {}, ("http://127.0.0.1:8000",)),  # the default
        (f'[upstream]\nurls = ["{A}", "{B}/"]\n', {}, {}, (A, B)),  # a TOML list
        (f'[upstream]\nurl = "{A}"\n', {}, {}, (A,)),
        (f'[upstream]\nurl = "{A}"\nurls = ["{B}"]\n', {}, {}, (B,)),  # both in one source: urls
        (f'[upstream]\nurl = "{A}"\nurls = []\n', {}, {}, (A,)),  # an empty urls says nothing (config.example.toml)
        ("", {"TOKEN_GUARD_UPSTREAM_URL": f"{A}, {B}"}, {}, (A, B)),  # comma-joined, as an env var gives several
        ("", {"TOKEN_GUARD_UPSTREAM_URLS": f"{A},{B}"}, {}, (A, B)),
        (f'[upstream]\nurls = ["{A}", "{B}"]\n', {}, {"upstream.url": C}, (C,)),  # a higher source's url wins
        (f'[upstream]\nurl = "{A}"\n', {"TOKEN_GUARD_UPSTREAM_URLS": f"{B},{C}"}, {}, (B, C)),  # and its urls
    ],
)
def test_the_upstream_urls_are_parsed_into_one_tuple(
    tmp_path: Path, text: str, env: dict[str, str], flags: dict[str, str], urls: tuple[str, ...]
) -> None:
    assert load_settings(flags, environ=env, config_file=write(tmp_path, text)).upstream.urls == urls


def test_the_upstream_flag_takes_several_replicas_comma_joined() -> None:
    from proxy.cli import build_parser, flags_from

    args = build_parser().parse_args(["serve", "--upstream", f"{A},{B}"])
    assert load_settings(flags_from(args), environ={}).upstream.urls == (A, B)
    with pytest.raises(SettingsError, match="upstream.url: expected an http:// or https:// URL, or a list of them"):
        load_settings({"upstream.url": f"{A},b:2"}, environ={})


def test_the_next_turns_share_is_a_policy_key_overridden_per_model(tmp_path: Path) -> None:
    config = write(
        tmp_path,
        "[policy]\nnext_turn_share_messages = 0.25\n"
        '[[models]]\nname = "a"\ntokenizer = "/a"\n[models.policy]\nnext_turn_share_messages = 0\n'
        '[[models]]\nname = "b"\ntokenizer = "/b"\n',
    )
    settings = load_settings({}, environ={}, config_file=config)
    first, _ = settings.models
    assert first.policy is not None and next_turn_share(first.policy, "messages") == 0.0
    assert next_turn_share(settings.policy, "messages") == 0.25 and next_turn_share(settings.policy, "responses") == 0.5
    with pytest.raises(SettingsError, match="policy.next_turn_share_chat: expected a number from 0 to 1"):
        load_settings({}, environ={"TOKEN_GUARD_POLICY_NEXT_TURN_SHARE_CHAT": "1.5"})
