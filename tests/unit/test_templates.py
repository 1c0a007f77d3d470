"""Templates: the sandbox, strict variables, HTML escaping, locales and Babel's formats."""

from __future__ import annotations

from typing import Any

import pytest

from kirim.errors import ConfigError, InvalidNotification
from kirim.notify import NotificationType, RenderError, Templates, preview
from kirim.notify.templates import fallbacks, formatting_locale, normalize_locale


def one(body: str, *, html: str | None = None, **locales: dict[str, str]) -> NotificationType:
    parts = {"body": body} if html is None else {"body": body, "html": html}
    return NotificationType(name="t", templates={"push": Templates(parts=parts, locales=locales)})


def body(ntype: NotificationType, data: Any, locale: str | None = None) -> str:
    return str(preview(ntype, data, locale=locale)["push"]["body"])


# -- the sandbox -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "source",
    [
        "{{ ''.__class__.__mro__ }}",
        "{{ cycler.__init__.__globals__ }}",
        "{{ joiner.__init__.__globals__['os'] }}",
        "{% for c in ''.__class__.__mro__[1].__subclasses__() %}{{ c }}{% endfor %}",
        "{{ order.__class__ }}",
    ],
)
def test_a_template_cannot_reach_python_internals(source: str) -> None:
    """Attribute access to Python's internals is refused by the sandbox, as an error."""
    with pytest.raises(RenderError, match="refused by the sandbox") as caught:
        body(one(source), {"order": {"id": 1}})
    assert "types.t.templates.push.body" in str(caught.value)
    assert isinstance(caught.value, InvalidNotification)


def test_a_template_cannot_change_its_data() -> None:
    """The sandbox is immutable: a template cannot append to a list it is given."""
    with pytest.raises(RenderError, match="unsafe"):
        body(one("{{ items.append(4) }}{{ items }}"), {"items": [1, 2, 3]})


@pytest.mark.parametrize(
    "source", ["{{ 'x' * 10000000 }}", "{{ [0] * 2000000 }}", "{{ 2 ** 100000 }}"]
)
def test_a_template_cannot_exhaust_memory_in_one_expression(source: str) -> None:
    """A huge repetition or power is refused; a small one is fine; lipsum is gone."""
    with pytest.raises(RenderError, match="refused by the sandbox"):
        body(one(source), {})
    assert body(one("{{ 'ab' * 3 }} {{ 2 ** 10 }} {{ range(3) | list }}"), {}) == (
        "ababab 1024 [0, 1, 2]"
    )
    with pytest.raises(RenderError, match="'lipsum' is undefined"):
        body(one("{{ lipsum(1000000) }}"), {})


def test_a_missing_variable_is_an_error_naming_it() -> None:
    """StrictUndefined: a variable the data lacks names itself, the template and line."""
    ntype = one("Hello {{ name }},\nyour order {{ order_id }} shipped.")
    with pytest.raises(RenderError) as caught:
        body(ntype, {"name": "Budi"})
    message = str(caught.value)
    assert "'order_id' is undefined" in message
    assert "types.t.templates.push.body (line 2)" in message


def test_a_missing_attribute_is_an_error_too() -> None:
    """A field missing inside a mapping is an error, not an empty string."""
    with pytest.raises(RenderError, match="has no attribute 'city'"):
        body(one("{{ address.city }}"), {"address": {}})


def test_a_syntax_error_is_found_when_the_type_is_made() -> None:
    """A template that does not compile is a ConfigError naming the part and its line."""
    with pytest.raises(ConfigError, match=r"types\.t\.templates\.push\.body: line 2"):
        one("fine\n{% if x %}never closed")


def test_the_data_may_not_use_the_reserved_name() -> None:
    """``kirim`` is the templates' own name for type, channel, locale and recipient."""
    assert body(one("{{ kirim.type }} {{ kirim.channel }} {{ kirim.locale }}"), {}) == "t push en"
    with pytest.raises(InvalidNotification, match="'kirim'"):
        body(one("x"), {"kirim": 1})


# -- escaping --------------------------------------------------------------------------


def test_only_the_html_part_is_escaped() -> None:
    """Autoescape applies to ``html``; a text part shows the data as it is."""
    ntype = one("Hi {{ name }}", html="<p>Hi {{ name }}</p>")
    payload = preview(ntype, {"name": "<script>x</script> & co"})["push"]
    assert payload["body"] == "Hi <script>x</script> & co"
    assert payload["html"] == "<p>Hi &lt;script&gt;x&lt;/script&gt; &amp; co</p>"


# -- locales ---------------------------------------------------------------------------


def test_locale_names_are_read_as_babel_writes_them() -> None:
    """``id-ID`` is ``id_ID``; an unknown locale is refused."""
    assert normalize_locale("id-ID") == "id_ID"
    assert normalize_locale("EN") == "en"
    with pytest.raises(ValueError, match="not a locale"):
        normalize_locale("xx_YY")


def test_the_fallback_chain_goes_from_specific_to_default() -> None:
    """id_ID -> id -> default; a script is a step of its own."""
    assert fallbacks("id_ID", "en") == ["id_ID", "id", "en"]
    assert fallbacks("zh_Hant_TW", "en") == ["zh_Hant_TW", "zh_Hant", "zh", "en"]
    assert fallbacks("en_GB", "en") == ["en_GB", "en"]
    assert fallbacks(None, "en") == ["en"]


def test_a_locale_variant_is_chosen_and_falls_back() -> None:
    """id_ID finds the ``id`` variant; a locale without one gets the default locale."""
    ntype = one("Hello {{ name }}", id={"body": "Halo {{ name }}"})
    data = {"name": "Budi"}
    assert preview(ntype, data, locale="id_ID")["push"] == {
        "type": "t",
        "locale": "id",
        "body": "Halo Budi",
    }
    assert preview(ntype, data, locale="id")["push"]["locale"] == "id"
    assert preview(ntype, data, locale="fr")["push"] == {
        "type": "t",
        "locale": "en",
        "body": "Hello Budi",
    }
    assert preview(ntype, data)["push"]["body"] == "Hello Budi"


def test_the_most_specific_variant_wins_part_by_part() -> None:
    """pt_BR's subject, then pt's body: each part from the first locale that has it."""
    ntype = NotificationType(
        name="t",
        templates={
            "email": Templates(
                parts={"subject": "Hi", "body": "Body"},
                locales={"pt": {"subject": "Olá", "body": "Corpo"}, "pt_BR": {"subject": "Oi"}},
            )
        },
    )
    payload = preview(ntype, {}, locale="pt_BR")["email"]
    assert (payload["subject"], payload["body"], payload["locale"]) == ("Oi", "Corpo", "pt_BR")


def test_a_variant_cannot_add_a_part_the_default_lacks() -> None:
    """Every locale's message has the same parts: a variant only varies them."""
    with pytest.raises(ConfigError, match=r"push\.id\.html: the default locale has no html"):
        one("x", id={"html": "<p>x</p>"})


def test_a_variant_for_the_default_locale_is_refused() -> None:
    """The default locale's text is the channel's own parts."""
    with pytest.raises(ConfigError, match="is the type's default locale"):
        one("x", en={"body": "y"})


def test_numbers_are_formatted_in_the_asked_locale_when_it_speaks_the_language() -> None:
    """A message written in ``id`` for id_ID formats in id_ID; for fr (no variant) in en."""
    assert formatting_locale("id_ID", "id") == "id_ID"
    assert formatting_locale("fr", "en") == "en"
    assert formatting_locale(None, "en") == "en"


# -- Babel -----------------------------------------------------------------------------


def test_dates_numbers_and_money_per_locale() -> None:
    """The same template formats dates, numbers and money the way each locale writes them."""
    ntype = one(
        "{{ at | date('long') }}|{{ n | number }}|{{ total | currency('EUR') }}|{{ r | percent }}",
        id={"body": "{{ at | date('long') }}|{{ n | number }}|{{ total | currency('EUR') }}"},
    )
    data = {"at": "2026-12-01T10:00:00+07:00", "n": 1234567.5, "total": "1500.25", "r": 0.25}
    assert body(ntype, data) == "December 1, 2026|1,234,567.5|€1,500.25|25%"
    indonesian = body(ntype, data, locale="id")
    assert indonesian.startswith("1 Desember 2026|1.234.567,5|")
    assert "1.500,25" in indonesian
    assert "€" in indonesian


def test_datetimes_keep_their_offset_or_move_to_a_zone() -> None:
    """A time shows in the offset it carries, or in the zone the template names."""
    ntype = one("{{ at | time }} / {{ at | time(tz='Asia/Jakarta') }} / {{ at | date }}")
    assert (
        body(ntype, {"at": "2026-12-01T23:30:00Z"}) == "11:30\u202fPM / 6:30\u202fAM / Dec 1, 2026"
    )
    epoch = one("{{ at | datetime('yyyy-MM-dd HH:mm', tz='Asia/Jakarta') }}")
    assert body(epoch, {"at": 1_800_000_000}) == "2027-01-15 15:00"


def test_a_bad_value_for_a_filter_is_a_clear_error() -> None:
    """A date that is none, a number that is none, an unknown zone: RenderError."""
    with pytest.raises(RenderError, match="not an ISO-8601 date"):
        body(one("{{ at | date }}"), {"at": "yesterday"})
    with pytest.raises(RenderError, match="is not a number"):
        body(one("{{ n | number }}"), {"n": "many"})
    with pytest.raises(RenderError, match="not an IANA time zone"):
        body(one("{{ at | time(tz='Mars/Olympus') }}"), {"at": "2026-12-01T10:00:00Z"})
