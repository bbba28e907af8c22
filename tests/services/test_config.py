"""Settings precedence and error messages."""

from __future__ import annotations

from pathlib import Path

import pytest

from protocol.config import ConfigError, Secret, Settings, load_settings

BASE_ENV = {"HOME": "/home/q"}


def test_defaults() -> None:
    s = load_settings(env=BASE_ENV)
    assert s.etcd_url == "http://127.0.0.1:2379"
    assert s.etcd_root == "/quire"
    assert s.redis_url == "redis://127.0.0.1:6379/0"
    assert s.data_dir == "/home/q/.local/share/quire"
    assert s.store_url == "file:///home/q/.local/share/quire/fragments/"
    assert s.spool_dir == "/home/q/.local/share/quire/spool"
    assert (s.zone, s.listen, s.journal_limit) == ("local", "127.0.0.1:8080", 1024)
    assert (s.lease_ttl_seconds, s.min_append_rate) == (20, 65536)
    assert (s.log_format, s.log_level) == ("auto", "INFO")
    assert s.broker_id


def test_precedence_cli_over_env_over_file_over_aws(tmp_path: Path) -> None:
    cfg = tmp_path / "quire.yaml"
    cfg.write_text(
        "etcd_root: /from-file\nzone: file-zone\njournal_limit: 7\n"
        "s3_access_key: file-key\nlisten: 0.0.0.0:9000\n"
    )
    env = {
        **BASE_ENV,
        "QUIRE_CONFIG": str(cfg),
        "QUIRE_ZONE": "env-zone",
        "QUIRE_JOURNAL_LIMIT": "8",
        "AWS_ACCESS_KEY_ID": "aws-key",
        "AWS_SECRET_ACCESS_KEY": "aws-secret",
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9001",
    }
    s = load_settings({"journal_limit": 9, "listen": None}, env=env)
    assert s.journal_limit == 9  # CLI
    assert s.zone == "env-zone"  # env over file
    assert s.etcd_root == "/from-file"  # file over default
    assert s.listen == "0.0.0.0:9000"  # a None override means "not given"
    assert s.s3_access_key == "file-key"  # file over ambient AWS variables
    assert s.s3_secret_key == Secret("aws-secret")  # AWS as fallback
    assert s.s3_endpoint == "http://127.0.0.1:9001"
    assert s.s3_secure is False and s.s3_host == "127.0.0.1:9001"


def test_explicit_path_beats_quire_config(tmp_path: Path) -> None:
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text("zone: a\n")
    b.write_text("zone: b\n")
    s = load_settings(env={**BASE_ENV, "QUIRE_CONFIG": str(a)}, config_path=b)
    assert s.zone == "b"


def test_data_dir_moves_derived_paths() -> None:
    s = load_settings(env={**BASE_ENV, "QUIRE_DATA_DIR": "/srv/q"})
    assert s.store_url == "file:///srv/q/fragments/"
    assert s.spool_dir == "/srv/q/spool"


@pytest.mark.parametrize(
    ("var", "value", "message"),
    [
        ("QUIRE_LEASE_TTL_SECONDS", "abc",
         "QUIRE_LEASE_TTL_SECONDS: expected a positive number of seconds, got 'abc'"),
        ("QUIRE_LEASE_TTL_SECONDS", "0", "QUIRE_LEASE_TTL_SECONDS: expected a positive number"),
        ("QUIRE_JOURNAL_LIMIT", "-1", "QUIRE_JOURNAL_LIMIT: expected a positive integer"),
        ("QUIRE_ETCD_URL", "localhost:2379", "QUIRE_ETCD_URL: expected an http(s) URL"),
        ("QUIRE_ETCD_ROOT", "quire", "QUIRE_ETCD_ROOT: expected an absolute key prefix"),
        ("QUIRE_STORE_URL", "ftp://x/", "QUIRE_STORE_URL: expected file:///"),
        ("QUIRE_LISTEN", "8080", "QUIRE_LISTEN: expected host:port"),
        ("QUIRE_S3_SECURE", "maybe", "QUIRE_S3_SECURE: expected true or false"),
        ("QUIRE_LOG_FORMAT", "xml", "QUIRE_LOG_FORMAT: expected one of auto|json|console"),
        ("QUIRE_ZONE", "a zone", "QUIRE_ZONE: expected a name"),
    ],
)  # fmt: skip
def test_bad_env_values(var: str, value: str, message: str) -> None:
    with pytest.raises(ConfigError, match="^" + _escape(message)):
        load_settings(env={**BASE_ENV, var: value})


def _escape(text: str) -> str:
    import re

    return re.escape(text)


def test_config_error_is_a_value_error() -> None:
    assert issubclass(ConfigError, ValueError)


def test_bad_cli_value_and_unknown_cli_key() -> None:
    with pytest.raises(ConfigError, match="^lease_ttl_seconds: expected a positive number"):
        load_settings({"lease_ttl_seconds": "soon"}, env=BASE_ENV)
    with pytest.raises(ConfigError, match="unknown setting 'nope'"):
        load_settings({"nope": 1}, env=BASE_ENV)


def test_yaml_errors_name_file_and_key(tmp_path: Path) -> None:
    cfg = tmp_path / "q.yaml"
    cfg.write_text("zone: a\nbogus_key: 1\n")
    with pytest.raises(ConfigError, match=r"q\.yaml: unknown key 'bogus_key'"):
        load_settings(env=BASE_ENV, config_path=cfg)
    cfg.write_text("lease_ttl_seconds: abc\n")
    with pytest.raises(ConfigError, match=r"q\.yaml: lease_ttl_seconds: expected a positive"):
        load_settings(env=BASE_ENV, config_path=cfg)
    cfg.write_text("- a list\n")
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_settings(env=BASE_ENV, config_path=cfg)
    with pytest.raises(ConfigError, match="cannot read"):
        load_settings(env=BASE_ENV, config_path=tmp_path / "missing.yaml")


def test_secret_never_shows() -> None:
    s = load_settings(env={**BASE_ENV, "QUIRE_S3_SECRET_KEY": "hunter2"})
    assert s.s3_secret_key is not None and s.s3_secret_key.reveal() == "hunter2"
    for text in (repr(s), str(s), str(s.redacted()), f"{s.s3_secret_key}"):
        assert "hunter2" not in text
    with pytest.raises(ConfigError) as err:
        load_settings(env={**BASE_ENV, "QUIRE_S3_SECRET_KEY": " "})
    assert "<hidden>" in str(err.value)


def test_auth_keys_and_tokens_never_show(tmp_path: Path) -> None:
    s = load_settings(env={**BASE_ENV, "QUIRE_AUTH_KEYS": "a2V5LWtleS1rZXk=", "QUIRE_TOKEN": "tok.en.sig",
                           "QUIRE_TLS_CA": str(tmp_path / "ca.pem")})
    assert s.auth_keys is not None and s.auth_keys.reveal() == "a2V5LWtleS1rZXk="
    assert s.token is not None and s.token.reveal() == "tok.en.sig"
    assert s.tls_ca == str(tmp_path / "ca.pem")
    for text in (repr(s), str(s), str(s.redacted())):
        assert "a2V5LWtleS1rZXk=" not in text and "tok.en.sig" not in text
    with pytest.raises(ConfigError) as err:
        load_settings(env={**BASE_ENV, "QUIRE_TOKEN": " "})
    assert "<hidden>" in str(err.value)


def test_settings_is_frozen() -> None:
    s = Settings()
    with pytest.raises(AttributeError):
        s.zone = "x"  # type: ignore[misc]
