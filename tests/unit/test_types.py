"""Notification types from kirim.toml's ``[types.NAME]``: what is read, and the messages
for what cannot be."""

from __future__ import annotations

import re
import tomllib
from datetime import time
from pathlib import Path
from typing import Any

import pytest

from kirim.config import load_config, parse_config
from kirim.errors import ConfigError
from kirim.notify import DigestRule, NotificationType, ThrottleRule, parse_type, preview
from kirim.preferences import Window

CHANNELS = """
[channels.email]
provider = "webhook"
url = "http://127.0.0.1:9/email"
[channels.push]
provider = "webhook"
url = "http://127.0.0.1:9/push"
"""

FULL = """
[types.order_shipped]
channels = ["push", "email"]
default_locale = "en"
critical = true
defaults = { push = false }
window = "08:00-21:00"
throttle = { limit = 3, window = "1h", per = "key", key = "order_id", over = "defer" }

[types.order_shipped.templates.email]
subject = "Order {{ order_id }} has shipped"
body = "It left on {{ shipped_at | date }}."
[types.order_shipped.templates.email.id]
subject = "Pesanan {{ order_id }} telah dikirim"

[types.order_shipped.templates.push]
title = "Shipped: {{ order_id }}"

[types.post_liked]
digest = { window = "10m" }
[types.post_liked.templates.push]
title = "{{ count }} new likes"
"""


FULL_ID_SUBJECT = "Pesanan {{ order_id }} telah dikirim"


def config(text: str) -> Any:
    return parse_config(tomllib.loads(CHANNELS + text))


def problem(text: str) -> str:
    with pytest.raises(ConfigError) as caught:
        config(text)
    return str(caught.value)


def test_a_full_type_is_read() -> None:
    """Every key of [types.NAME] lands in the NotificationType, channels in order."""
    types = config(FULL).types
    t = types["order_shipped"]
    assert t.channels == ("push", "email")
    assert t.critical
    assert dict(t.defaults) == {"push": False}
    assert t.window == Window(start=time(8, 0), end=time(21, 0))
    assert t.throttle == ThrottleRule(
        limit=3, window=3600.0, per="key", key="order_id", over="defer"
    )
    assert t.templates["email"].locales == {
        "id": {"subject": "Pesanan {{ order_id }} telah dikirim"}
    }
    assert types["post_liked"].digest == DigestRule(window=600.0, key="recipient")
    policy = t.policy
    assert (policy.name, policy.critical, policy.defaults, policy.window) == (
        "order_shipped",
        True,
        {"push": False},
        t.window,
    )


def test_no_types_is_an_empty_mapping() -> None:
    """A config without [types] has none."""
    assert config("").types == {}


#: a type with one template, after the keys a test gives it
PUSH = "\n[types.t.templates.push]\nbody = 'x'"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[types.t]\nbogus = 1" + PUSH, r"unknown \[types.t\] key"),
        ("[types.t]\n", "types.t: no templates"),
        ("[types.t.templates.sms]\nbody = 'x'", "types.t: no channel 'sms' is configured"),
        ("[types.t.templates.push]\nfooter = 'x'", r"push\.footer: not a part"),
        ("[types.t.templates.push]\nbody = 1", r"push\.body must be a template"),
        ("[types.t.templates.push]\nbody = '{{ x'", r"push\.body: line 1"),
        ("[types.t]\ndefault_locale = 'xx'" + PUSH, "default_locale: 'xx' is not a locale"),
        (PUSH + "\n[types.t.templates.push.qq]\nbody = 'y'", r"push\.qq: 'qq' is not a locale"),
        ("[types.t]\ncritical = 'yes'" + PUSH, "critical must be true or false"),
        ("[types.t]\ndefaults = { email = false }" + PUSH, "defaults.email: not a channel"),
        ("[types.t]\nwindow = '8-21'" + PUSH, r"types\.t\.window"),
        ("[types.t]\nchannels = ['email']" + PUSH, "'email' has no templates"),
        ("[types.t]\nchannels = ['push', 'push']" + PUSH, "names a channel twice"),
        ("[types.t]\nthrottle = { limit = 0, window = '1h' }" + PUSH, "limit must be an integer"),
        ("[types.t]\nthrottle = { limit = 2 }" + PUSH, "throttle needs limit and window"),
        (
            "[types.t]\nthrottle = { limit = 2, window = 'soon' }" + PUSH,
            "throttle.window must be a duration",
        ),
        ("[types.t]\nthrottle = { limit = 2, window = '1h', per = 'key' }" + PUSH, "needs key"),
        (
            "[types.t]\nthrottle = { limit = 2, window = '1h', over = 'drop' }" + PUSH,
            "over must be suppress or defer",
        ),
        (
            "[types.t]\ndigest = { window = '10m' }\nthrottle = { limit = 2, window = '1h' }"
            + PUSH,
            "throttle and digest together",
        ),
        ("[types.t]\ndigest = { key = 'x' }" + PUSH, "digest needs a window"),
        ("[types.'a b'.templates.push]\nbody = 'x'", "a type's name is"),
    ],
)
def test_a_bad_type_is_a_config_error_naming_the_key(text: str, expected: str) -> None:
    """Each mistake in [types.NAME] is one ConfigError that says where it is."""
    message = problem(text)
    assert message.startswith("config: ")
    assert re.search(expected, message), message


def test_templates_are_read_from_a_directory_beside_the_config(tmp_path: Path) -> None:
    """template_dir: CHANNEL/PART.j2 and CHANNEL/PART.LOCALE.j2, relative to kirim.toml."""
    root = tmp_path / "templates" / "shipped"
    (root / "email").mkdir(parents=True)
    (root / "email" / "subject.j2").write_text("Order {{ id }}", encoding="utf-8")
    (root / "email" / "body.j2").write_text("Shipped.\n", encoding="utf-8")
    (root / "email" / "subject.id.j2").write_text("Pesanan {{ id }}", encoding="utf-8")
    (tmp_path / "kirim.toml").write_text(
        CHANNELS + '[types.shipped]\ntemplate_dir = "templates/shipped"\n', encoding="utf-8"
    )
    t = load_config(tmp_path / "kirim.toml").types["shipped"]
    assert preview(t, {"id": 7}, locale="id")["email"] == {
        "type": "shipped",
        "locale": "id",
        "subject": "Pesanan 7",
        "body": "Shipped.",
    }


def test_a_part_given_inline_and_as_a_file_is_refused(tmp_path: Path) -> None:
    """One part has one source."""
    (tmp_path / "t" / "push").mkdir(parents=True)
    (tmp_path / "t" / "push" / "body.j2").write_text("file", encoding="utf-8")
    spec = {"template_dir": "t", "templates": {"push": {"body": "inline"}}}
    with pytest.raises(ConfigError, match=r"push\.body is given inline and as a file"):
        parse_type("t", spec, base=tmp_path)


def test_a_missing_template_dir_is_refused(tmp_path: Path) -> None:
    """The directory must exist and hold templates."""
    with pytest.raises(ConfigError, match="is not a directory"):
        parse_type("t", {"template_dir": "nowhere"}, base=tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"no CHANNEL/PART\.j2 files"):
        parse_type("t", {"template_dir": "empty"}, base=tmp_path)


def test_a_type_built_in_python_gets_the_same_checks() -> None:
    """parse_type takes the table as a dict; NotificationType checks what it is given."""
    t = parse_type("t", {"templates": {"push": {"body": "{{ x }}", "id": {"body": "[{{ x }}]"}}}})
    assert preview(t, {"x": 1}, locale="id-ID")["push"]["body"] == "[1]"
    with pytest.raises(ConfigError, match="must be Templates"):
        NotificationType(name="t", templates={"push": {"body": "x"}})  # type: ignore[dict-item]
