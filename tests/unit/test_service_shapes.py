"""The services' parts of a template and their requests: SMS segments by GSM-7 or
UCS-2, JSON parts whose strings are templates (no data can break them), collapse ids
no template can turn off, and the services' kirim.toml checks (never showing a key)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from kirim.cli import main
from kirim.config import parse_config
from kirim.errors import ConfigError
from kirim.notify.messages import preview
from kirim.notify.shapes import segments
from kirim.notify.types import parse_type
from kirim.providers.exchange import apns_id, collapse_id
from kirim.providers.shaping import apns_payload, fcm_message, slack_message, webpush_message


@pytest.mark.parametrize(
    ("text", "encoding", "units", "count"),
    [
        ("", "GSM-7", 0, 0),
        ("a" * 160, "GSM-7", 160, 1),
        ("a" * 161, "GSM-7", 161, 2),
        ("a" * 306, "GSM-7", 306, 2),
        ("a" * 307, "GSM-7", 307, 3),
        ("€" * 80, "GSM-7", 160, 1),  # an extension character takes two septets
        ("é" * 160, "GSM-7", 160, 1),  # in the basic table
        ("ó" * 70, "UCS-2", 70, 1),  # not in GSM 03.38: the whole text is UCS-2
        ("ó" * 71, "UCS-2", 71, 2),
        ("😀" * 35, "UCS-2", 70, 1),  # two UTF-16 units each
    ],
)
def test_an_sms_is_counted_in_its_encodings_segments(
    text: str, encoding: str, units: int, count: int
) -> None:
    """GSM-7 fits 160 septets in one SMS, 153 per segment past it; UCS-2 70 and 67."""
    found = segments(text)
    assert (found.encoding, found.units, found.segments) == (encoding, units, count)


def test_a_json_part_renders_each_string_and_no_data_breaks_it() -> None:
    """A value with quotes and braces stays a string of the document: no key added."""
    ntype = parse_type(
        "t", {"templates": {"push": {"title": "T", "apns": '{"aps": {"x": "{{ v }}"}}'}}}
    )
    payload = preview(ntype, {"v": '", "injected": {"a": 1}, "'})["push"]
    assert payload["apns"] == {"aps": {"x": '", "injected": {"a": 1}, "'}}


@pytest.mark.parametrize(
    ("part", "what"),
    [('{"aps": ', "not a JSON document"), ('{"aps": "{{ x "}', "line 1")],
)
def test_a_json_part_that_cannot_be_used_is_a_config_error(part: str, what: str) -> None:
    """Not JSON, or a string in it that does not compile: the type is refused."""
    with pytest.raises(ConfigError, match="apns") as raised:
        parse_type("t", {"templates": {"push": {"title": "T", "apns": part}}})
    assert what in str(raised.value)


def test_the_collapse_ids_are_set_over_what_a_template_says() -> None:
    """A template's fcm part cannot change the collapse key, the tag or the token; the
    APNs part merges into aps; Web Push's tag is the collapse id."""
    cid = collapse_id("k")
    message = fcm_message(
        {
            "title": "T",
            "fcm": {"token": "x", "android": {"collapse_key": "mine", "priority": "high"}},
        },
        "tok",
        cid,
    )
    assert message["token"] == "tok"
    assert message["android"] == {
        "collapse_key": cid,
        "priority": "high",
        "notification": {"tag": cid},
    }
    assert apns_payload({"title": "T", "apns": {"aps": {"sound": "x"}}}) == {
        "aps": {"alert": {"title": "T"}, "sound": "x"}
    }
    assert webpush_message({"body": "B", "webpush": {"tag": "mine"}}, cid)["tag"] == cid
    assert slack_message({"title": "T", "slack": [{"type": "divider"}]}) == {
        "text": "T",
        "blocks": [{"type": "divider"}],
    }


def test_the_ids_of_a_key_are_stable_and_within_the_services_limits() -> None:
    """The collapse id is 32 hex digits (APNs ≤ 64 bytes, an RFC 8030 Topic ≤ 32 of
    base64url), the apns-id a UUID; both the same for every resend of one key."""
    key = "k" * 255
    assert collapse_id(key) == collapse_id(key)
    assert len(collapse_id(key)) == 32
    assert int(collapse_id(key), 16) >= 0
    assert apns_id(key) == apns_id(key)
    assert len(apns_id(key)) == 36
    assert collapse_id("a") != collapse_id("b")


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"provider": "apns", "key_id": "K", "topic": "t", "private_key": "x"}, "team_id"),
        ({"provider": "apns", "team_id": "T", "key_id": "K", "topic": "t"}, "private_key"),
        (
            {
                "provider": "apns",
                "team_id": "T",
                "key_id": "K",
                "topic": "t",
                "private_key": "x",
                "lookup": True,
            },
            "has no lookup",
        ),
        ({"provider": "fcm"}, "service_account_file"),
        ({"provider": "webpush", "vapid_private_key": "k"}, "vapid_subject"),
        ({"provider": "twilio", "account_sid": "AC1", "auth_token": "s3cr3t"}, "from"),
        (
            {"provider": "twilio", "account_sid": "AC1", "auth_token": "s3cr3t", "from": "5"},
            "E.164",
        ),
        ({"provider": "slack", "token": "s3cr3t"}, "xoxb-"),
        ({"provider": "slack", "token": "xoxb-s3cr3t", "lookup": True}, "fixed channel"),
        ({"provider": "slack", "token": "xoxb-s3cr3t", "url": 3, "host": "h"}, "host"),
    ],
)
def test_a_service_channel_that_cannot_be_used_is_refused_without_its_secret(
    table: dict[str, object], message: str
) -> None:
    """Each service's required keys, its lookup rule and its stray keys are checked
    when the configuration is read; the error never shows a secret."""
    with pytest.raises(ConfigError, match=message) as raised:
        parse_config({"channels": {"c": table}})
    assert "s3cr3t" not in str(raised.value)


def test_an_apns_key_that_cannot_sign_is_refused_at_build_without_showing_it() -> None:
    """A private_key that is no ES256 key fails when the channel is built, naming the
    key's option, never its text."""
    spec = parse_config(
        {
            "channels": {
                "c": {
                    "provider": "apns",
                    "team_id": "T",
                    "key_id": "K",
                    "topic": "t",
                    "private_key": "not-a-key-s3cr3t",
                }
            }
        }
    ).channels["c"]
    with pytest.raises(ConfigError, match="private_key cannot sign") as raised:
        spec.build()
    assert "s3cr3t" not in str(raised.value)


def test_render_shows_sms_segments_and_warns_past_three(tmp_path: Path) -> None:
    """kirim render prints each SMS's encoding and segments, and a warning on stderr
    for one of more than 3 segments."""
    config = tmp_path / "kirim.toml"
    config.write_text(
        '[channels.sms]\nprovider = "webhook"\nurl = "http://127.0.0.1:9/x"\n'
        '[types.t.templates.sms]\nsms = "{{ text }}"\n'
    )
    runner = CliRunner()
    args = ["--config", str(config), "render", "t", "--data"]
    short = runner.invoke(main, [*args, '{"text": "hi"}'])
    assert "sms segments: 1 (GSM-7, 2 units)" in short.output
    assert "Warning" not in short.output
    data = json.dumps({"text": "x" * 700})
    long = runner.invoke(main, [*args, data])
    assert "sms segments: 5 (GSM-7, 700 units)" in long.stdout
    assert "Warning: [sms] the SMS is 5 segments" in long.stderr
