"""Keys that moved (loader.RENAMED): the [redis] section's new names work; the old [admission] redis_* names still load
from a file, the environment or a flag, with a warning naming the new key; one source giving both differently is an
error that names both."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.cli import build_parser, flags_from
from proxy.settings import RedisSettings, SettingsError, load_settings
from proxy.settings.spellings import RENAMED

URL = "redis://r:6379/0"
FLEET = RedisSettings(url=URL, failure="closed", timeout_ms=100, lease_s=5.0, block_share=0.25)
NEW_TOML = (
    '[redis]\nurl = "redis://r:6379/0"\nfailure = "closed"\ntimeout_ms = 100\nlease_s = 5.0\nblock_share = 0.25\n'
)
OLD_TOML = (
    '[admission]\nredis_url = "redis://r:6379/0"\nredis_failure = "closed"\nredis_timeout_ms = 100\n'
    "redis_lease_s = 5.0\nredis_block_share = 0.25\n"
)
NEW_ENV = {"TOKEN_GUARD_REDIS_URL": URL, "TOKEN_GUARD_REDIS_FAILURE": "closed", "TOKEN_GUARD_REDIS_TIMEOUT_MS": "100",
           "TOKEN_GUARD_REDIS_LEASE_S": "5", "TOKEN_GUARD_REDIS_BLOCK_SHARE": "0.25"}  # fmt: skip
OLD_ENV = {"TOKEN_GUARD_ADMISSION_" + name.removeprefix("TOKEN_GUARD_"): value for name, value in NEW_ENV.items()}


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "tg.toml"
    path.write_text(text)
    return path


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]


def test_every_renamed_key_lands_in_the_redis_section() -> None:
    assert {new.partition(".")[0] for new in RENAMED.values()} == {"redis"}
    assert {new.partition(".")[2] for new in RENAMED.values()} == set(RedisSettings.__dataclass_fields__)


def test_the_new_keys_load_from_a_file_and_the_environment_without_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert load_settings({}, environ={}, config_file=write(tmp_path, NEW_TOML)).redis == FLEET
    assert load_settings({}, environ=NEW_ENV).redis == FLEET
    assert warnings(caplog) == []


def test_the_old_keys_load_from_a_file_with_a_warning_naming_each_new_key(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = load_settings({}, environ={}, config_file=write(tmp_path, OLD_TOML))
    assert settings.redis == FLEET
    said = warnings(caplog)
    assert len(said) == len(RENAMED)
    assert any("admission.redis_url" in line and "redis.url ([redis] url)" in line for line in said)
    assert any("admission.redis_block_share" in line and "[redis] block_share" in line for line in said)


def test_the_old_environment_variables_load_with_a_warning_naming_the_new_ones(
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert load_settings({}, environ=OLD_ENV).redis == FLEET
    said = warnings(caplog)
    assert any("TOKEN_GUARD_ADMISSION_REDIS_URL" in line and "TOKEN_GUARD_REDIS_URL" in line for line in said)
    assert any("TOKEN_GUARD_ADMISSION_REDIS_LEASE_S" in line and "TOKEN_GUARD_REDIS_LEASE_S" in line for line in said)


def test_the_redis_url_flag_sets_the_new_key_and_an_old_flag_key_still_works(caplog: pytest.LogCaptureFixture) -> None:
    args = build_parser().parse_args(["serve", "--redis-url", URL])
    assert flags_from(args) == {"redis.url": URL}
    assert load_settings(flags_from(args), environ={}).redis.url == URL
    assert warnings(caplog) == []
    assert load_settings({"admission.redis_failure": "closed"}, environ={}).redis.failure == "closed"
    assert any("admission.redis_failure" in line and "redis.failure" in line for line in warnings(caplog))


def test_a_higher_source_overrides_an_old_key_with_the_new_one(tmp_path: Path) -> None:
    config = write(tmp_path, OLD_TOML)
    settings = load_settings({"redis.url": "redis://flag:1/0"}, environ={"TOKEN_GUARD_REDIS_FAILURE": "open"},
                             config_file=config)  # fmt: skip
    assert (settings.redis.url, settings.redis.failure, settings.redis.timeout_ms) == ("redis://flag:1/0", "open", 100)


def test_both_names_with_the_same_value_load(tmp_path: Path) -> None:
    assert load_settings({}, environ={**OLD_ENV, **NEW_ENV}).redis == FLEET
    both = write(tmp_path, NEW_TOML + OLD_TOML.replace("redis_lease_s = 5.0", "redis_lease_s = 5"))
    assert load_settings({}, environ={}, config_file=both).redis == FLEET


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("toml", "redis.url: given twice with different values, as redis.url ([redis] url) and by its old name "
                 "admission.redis_url (from "),
        ("env", "redis.url: given twice with different values, as redis.url (TOKEN_GUARD_REDIS_URL) and by its old "
                "name admission.redis_url (from TOKEN_GUARD_ADMISSION_REDIS_URL); keep only redis.url"),
        ("flags", "redis.url: given twice with different values, as redis.url (--redis-url) and by its old name "
                  "admission.redis_url (from --redis-url); keep only redis.url"),
    ],
)  # fmt: skip
def test_both_names_with_different_values_in_one_source_are_an_error(tmp_path: Path, source: str, message: str) -> None:
    other = "redis://:secret@other:6379/0"
    config = write(tmp_path, f'[redis]\nurl = "{URL}"\n[admission]\nredis_url = "{other}"\n')
    given = {
        "toml": ({}, {}, config),
        "env": ({}, {"TOKEN_GUARD_REDIS_URL": URL, "TOKEN_GUARD_ADMISSION_REDIS_URL": other}, None),
        "flags": ({"redis.url": URL, "admission.redis_url": other}, {}, None),
    }
    flags, environ, config_file = given[source]
    with pytest.raises(SettingsError) as info:
        load_settings(flags, environ=environ, config_file=config_file)
    assert message in str(info.value)
    assert "secret" not in str(info.value)  # a Redis URL's password never reaches a message
