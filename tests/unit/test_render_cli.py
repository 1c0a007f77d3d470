"""`kirim render`: a type's messages previewed from kirim.toml, without a database."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from kirim.cli import main
from kirim.observe.logging import configure

CONFIG = """
[channels.email]
provider = "webhook"
url = "http://127.0.0.1:9/email"
[channels.push]
provider = "webhook"
url = "http://127.0.0.1:9/push"

[types.order_shipped]
[types.order_shipped.templates.email]
subject = "Order {{ order_id }} has shipped"
body = \"\"\"Hello {{ name }},
it cost {{ total | currency("IDR") }}.\"\"\"
html = "<p>Hello {{ name }}</p>"
[types.order_shipped.templates.email.id]
subject = "Pesanan {{ order_id }} telah dikirim"
[types.order_shipped.templates.push]
title = "Shipped: {{ order_id }}"

[types.post_liked]
digest = { window = "10m" }
[types.post_liked.templates.push]
title = "{{ count }} likes: {{ events | map(attribute='by') | join(', ') }}"
"""
DATA = '{"order_id": "48291", "name": "<Budi>", "total": 1500000}'


@pytest.fixture(autouse=True)
def _quiet_logs(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("KIRIM_DATABASE_URL", raising=False)
    yield
    configure(level="warning")


@pytest.fixture
def kirim(tmp_path: Path):  # type: ignore[no-untyped-def]
    path = tmp_path / "kirim.toml"
    path.write_text(f'database = "sqlite:///{tmp_path / "k.db"}"\n{CONFIG}', encoding="utf-8")

    def run(*args: str, input: str | None = None) -> Result:
        return CliRunner().invoke(main, ["--config", str(path), *args], input=input)

    return run


def test_render_shows_every_channel_in_the_locale(kirim, tmp_path: Path) -> None:
    """Each channel's parts, from the locale's variant else the default; no database."""
    result = kirim("render", "order_shipped", "--data", DATA, "--locale", "id-ID")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.splitlines() == [
        "[email] locale id",
        "  subject: Pesanan 48291 telah dikirim",
        "  body:",
        "    Hello <Budi>,",
        "    it cost Rp1.500.000.",  # id_ID: Indonesian separators
        "  html: <p>Hello &lt;Budi&gt;</p>",
        "[push] locale en",
        "  title: Shipped: 48291",
    ]
    assert not (tmp_path / "k.db").exists()


def test_render_json_is_channel_to_payload(kirim) -> None:
    """--json prints the payloads notify_event would record; --channel keeps one."""
    result = kirim("render", "order_shipped", "--data", DATA, "--channel", "push", "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout) == {
        "push": {"type": "order_shipped", "locale": "en", "title": "Shipped: 48291"}
    }


def test_render_reads_data_from_stdin_and_a_file(kirim, tmp_path: Path) -> None:
    """--data - reads stdin, --data @FILE a file."""
    file = tmp_path / "event.json"
    file.write_text(DATA, encoding="utf-8")
    from_file = kirim("render", "order_shipped", "--data", f"@{file}", "--json")
    from_stdin = kirim("render", "order_shipped", "--data", "-", "--json", input=DATA)
    assert from_file.exit_code == from_stdin.exit_code == 0
    assert json.loads(from_file.stdout) == json.loads(from_stdin.stdout)


def test_a_digest_type_renders_a_list_of_events(kirim) -> None:
    """A digest type's data: a list of events' data (or one event's)."""
    events = '[{"by": "ana"}, {"by": "budi"}]'
    result = kirim("render", "post_liked", "--data", events, "--json")
    assert json.loads(result.stdout)["push"]["title"] == "2 likes: ana, budi"
    one = kirim("render", "post_liked", "--data", '{"by": "ana"}', "--json")
    assert json.loads(one.stdout)["push"]["title"] == "1 likes: ana"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("render", "order_shipped", "--data", '{"order_id": 1}'), "'name' is undefined"),
        (("render", "nope"), "no notification type 'nope' (known: order_shipped, post_liked)"),
        (("render", "order_shipped", "--data", "{bad"), "--data is not valid JSON"),
        (("render", "order_shipped", "--data", DATA, "--channel", "sms"), "no channel 'sms'"),
        (("render", "order_shipped", "--data", DATA, "--locale", "qq"), "'qq' is not a locale"),
        (("render", "order_shipped", "--data", "[1]"), "data must be a JSON object"),
    ],
)
def test_render_errors_exit_2_with_one_line(kirim, args: tuple[str, ...], message: str) -> None:
    """A missing variable, an unknown type, channel or locale, bad JSON: exit 2, one line."""
    result = kirim(*args)
    assert result.exit_code == 2
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert result.stdout == ""


def test_render_sandbox_refusal_is_an_error(tmp_path: Path) -> None:
    """A template that reaches for Python's internals is refused, exit 2."""
    path = tmp_path / "kirim.toml"
    path.write_text(
        '[channels.push]\nprovider = "webhook"\nurl = "http://127.0.0.1:9/"\n'
        "[types.evil.templates.push]\nbody = \"{{ ''.__class__.__mro__ }}\"\n",
        encoding="utf-8",
    )
    result = CliRunner().invoke(main, ["--config", str(path), "render", "evil"])
    assert result.exit_code == 2
    assert "refused by the sandbox" in result.stderr


def test_render_help_has_examples(kirim) -> None:
    """The help text says what it does, with examples."""
    result = kirim("render", "--help")
    assert result.exit_code == 0
    assert "Preview a notification type's messages" in result.stdout
    assert "kirim render order_shipped --data" in result.stdout
    assert "render" in kirim("--help").stdout


# -- kirim event ---------------------------------------------------------------------------


def test_event_records_a_delivery_per_recipient_and_channel(kirim) -> None:
    """`kirim event` fans one event out; the same event again creates nothing."""
    assert kirim("init").exit_code == 0
    args = ("event", "order_shipped", "--event", "o-1", "--data", DATA)
    first = kirim(
        *args, "--recipient", "u1", "--recipient", '{"id": "u2", "locale": "id"}', "--json"
    )
    assert first.exit_code == 0, first.stderr
    made = json.loads(first.stdout)["deliveries"]
    assert [(d["recipient_id"], d["channel"], d["created"]) for d in made] == [
        ("u1", "email", True),
        ("u1", "push", True),
        ("u2", "email", True),
        ("u2", "push", True),
    ]
    again = kirim(*args, "--recipient", "u1")
    assert again.exit_code == 0, again.stderr
    assert (
        again.stdout.splitlines()[0]
        == f"u1 email: delivery {made[0]['delivery_id']} exists, pending"
    )


def test_event_shows_a_suppression_with_its_reason(kirim) -> None:
    assert kirim("init").exit_code == 0
    assert kirim("prefs", "set", "u1", "--opt-out").exit_code == 0
    result = kirim("event", "order_shipped", "--event", "o-1", "--recipient", "u1", "--data", DATA)
    assert result.exit_code == 0, result.stderr
    assert "u1 push: delivery 2 created, suppressed (opted_out)" in result.stdout


def test_event_with_a_missing_variable_writes_nothing(kirim) -> None:
    assert kirim("init").exit_code == 0
    bad = kirim("event", "order_shipped", "--event", "o-1", "--recipient", "u1", "--data", "{}")
    assert bad.exit_code == 2
    assert "order_id" in bad.stderr
    listed = kirim("list", "--json")
    assert listed.exit_code == 0, listed.stderr
    assert json.loads(listed.stdout) == []
