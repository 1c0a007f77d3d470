"""The in-app inbox's configuration: ``provider = "inbox"`` and ``[inbox]`` (the feed
tokens' secret, from the file or KIRIM_INBOX_SECRET, never shown; the CORS origins),
``kirim doctor``'s inbox check, and feed tokens' signing."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from kirim import feed_tokens
from kirim.cli import main
from kirim.config import parse_config
from kirim.errors import ConfigError
from kirim.providers.inbox import InboxProvider

SECRET = "0123456789abcdef0123456789abcdef"
INBOX = '[channels.inbox]\nprovider = "inbox"\n'


def test_an_inbox_channel_builds_and_is_idempotent() -> None:
    """provider = "inbox" takes no option of another provider and cannot be made
    non-idempotent; its provider is idempotent by construction."""
    config = parse_config({"channels": {"inbox": {"provider": "inbox"}}})
    channel = config.channels["inbox"].build()
    assert isinstance(channel.provider, InboxProvider)
    assert channel.idempotent
    with pytest.raises(ConfigError, match="not an option of provider 'inbox'"):
        parse_config({"channels": {"inbox": {"provider": "inbox", "url": "http://x"}}})
    with pytest.raises(ConfigError, match="idempotent by construction"):
        parse_config({"channels": {"inbox": {"provider": "inbox", "idempotent": False}}})


def test_the_inbox_table_is_checked_and_the_environment_wins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """[inbox] secret must be long enough, origins must be origins; KIRIM_INBOX_SECRET
    overrides the file; the secret is not in the settings' repr."""
    monkeypatch.delenv("KIRIM_INBOX_SECRET", raising=False)
    inbox = parse_config({"inbox": {"secret": SECRET, "allowed_origins": ["https://a.example"]}})
    assert inbox.inbox.secret == SECRET
    assert inbox.inbox.allowed_origins == ("https://a.example",)
    assert SECRET not in repr(inbox)
    with pytest.raises(ConfigError, match="at least 16") as refused:
        parse_config({"inbox": {"secret": "short"}})
    assert "short" not in str(refused.value)
    for bad in (["app.example"], ["https://a.example/path"], "https://a.example"):
        with pytest.raises(ConfigError, match="allowed_origins"):
            parse_config({"inbox": {"allowed_origins": bad}})
    with pytest.raises(ConfigError, match="unknown \\[inbox\\]"):
        parse_config({"inbox": {"secrets": SECRET}})
    monkeypatch.setenv("KIRIM_INBOX_SECRET", "from-the-environment-" + SECRET)
    assert parse_config({"inbox": {"secret": SECRET}}).inbox.secret.startswith("from-the-env")


def test_a_feed_token_holds_its_recipient_and_expiry_and_nothing_else_passes() -> None:
    """A token verifies with its secret until it expires; another secret, an altered
    body or signature, a token of another kind all fail."""
    token = feed_tokens.sign(SECRET, "user/1007", 2_000_000_000.0)
    assert token.startswith("kfeed_")
    assert feed_tokens.verify(SECRET, token, 1_900_000_000.0) == ("user/1007", 2_000_000_000.0)
    with pytest.raises(feed_tokens.BadFeedToken, match="expired"):
        feed_tokens.verify(SECRET, token, 2_000_000_000.0)
    with pytest.raises(feed_tokens.BadFeedToken, match="signature"):
        feed_tokens.verify("another-secret-of-enough-length", token, 0)
    other = feed_tokens.sign(SECRET, "user/1008", 2_000_000_000.0)
    _body, mac = token.split(".")
    with pytest.raises(feed_tokens.BadFeedToken):
        feed_tokens.verify(SECRET, other.split(".")[0] + "." + mac, 0)
    for bad in ("kirim_abc", "kfeed_", "kfeed_abc", "kfeed_a.b", "kfeed_é.x"):
        with pytest.raises(feed_tokens.BadFeedToken):
            feed_tokens.verify(SECRET, bad, 0)


def _run(tmp_path: Path, config: str, *args: str) -> str:
    path = tmp_path / "kirim.toml"
    path.write_text(f'database = "sqlite:///{tmp_path / "k.db"}"\n{config}')
    done = CliRunner().invoke(main, ["--config", str(path), *args])
    assert done.exit_code == 0, done.output
    return done.output


def test_doctor_says_whether_the_secret_is_set_and_never_shows_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With an inbox channel and no secret, doctor warns; with one, it is OK and the
    secret appears nowhere in its output (text or JSON)."""
    monkeypatch.delenv("KIRIM_INBOX_SECRET", raising=False)
    _run(tmp_path, INBOX, "init")
    warned = _run(tmp_path, INBOX, "doctor")
    assert " inbox " in warned
    assert "no [inbox] secret" in warned
    config = INBOX + f'[inbox]\nsecret = "{SECRET}"\n'
    for args in (("doctor",), ("doctor", "--json")):
        shown = _run(tmp_path, config, *args)
        assert "secret set" in shown
        assert SECRET not in shown


def test_serve_says_whether_the_secret_is_set_never_what() -> None:
    """kirim serve's serving line says inbox_secret=set and the feed origins; the
    secret itself is in none of its fields."""
    import socket
    from typing import Any

    from kirim.cli.serve import _say_serving

    logs: list[dict[str, Any]] = []

    class Log:
        def info(self, event: str, **fields: Any) -> None:
            logs.append({"event": event, **fields})

    config = parse_config(
        {"inbox": {"secret": SECRET, "allowed_origins": ["https://a.example"]}},
        database="sqlite:///x.db",
    )
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        _say_serving(Log(), sock, config)
    [line] = logs
    assert (line["inbox_secret"], line["feed_origins"]) == ("set", "https://a.example")
    assert SECRET not in repr(line)
