"""Templates are bounded in what they make and in the work they do: no expression, loop,
filter, macro or concatenation builds more than ``MAX_OUTPUT`` characters, a render
takes at most ``MAX_STEPS`` steps and its deadline, and compiling a template (loading
kirim.toml) never evaluates any of it."""

from __future__ import annotations

import itertools
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kirim.notify import NotificationType, RenderError, Templates, preview, sandbox

#: each of these built 32 MB or more (a gigabyte with the issue's numbers)
BLOW_UPS = [
    "{{ 'x'.ljust(32000000) }}",
    "{{ 'x'.center(32000000) }}",
    "{{ 'x'.zfill(32000000) }}",
    "{{ ''|center(32000000) }}",
    "{{ '%32000000s' % 'x' }}",
    "{{ '%*s' % (32000000, 'x') }}",
    "{{ '{:32000000}'.format('x') }}",
    "{{ '{:>{w}}'.format('x', w=32000000) }}",
    "{{ '%32000000s' | format('x') }}",
    "{{ (['x' * 32000] * 1000) | join }}",
    "{{ range(32) | join('x' * 1000000) }}",
    "{{ ('x' * 1000000) | replace('x', 'x' * 32) }}",
    "{{ ('x' * 1000000).replace('x', 'x' * 32) }}",
    "{{ ('x' * 100).replace('', 'y' * 400000) }}",
    "{{ ('x\\n' * 100000) | indent(320) }}",
    "{{ [1] | batch(4000000, 0) | list | length }}",
    "{{ {'a': 1} | tojson(indent=32000000) }}",
    "{{ ('\\t' * 1000000).expandtabs(32) }}",
    "{% set ns = namespace(s='x') %}{% for i in range(25) %}"
    "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s | length }}",
    "{% set ns = namespace(s='x') %}{% for i in range(25) %}"
    "{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s | length }}",
    "{% macro m(s) %}{{ s }}{{ s }}{% endmacro %}" + "{{ " + "m(" * 25 + "'x'" + ")" * 25 + " }}",
    "{% set ns = namespace(n=3) %}{% for i in range(22) %}"
    "{% set ns.n = ns.n * ns.n %}{% endfor %}{{ ns.n > 0 }}",
]


def one(source: str) -> NotificationType:
    return NotificationType(name="t", templates={"push": Templates(parts={"body": source})})


def body(ntype: NotificationType, data: object = None) -> str:
    return str(preview(ntype, data or {})["push"]["body"])


@pytest.mark.parametrize("source", BLOW_UPS)
def test_no_expression_builds_more_than_the_bound(source: str) -> None:
    """Padding, printf and str.format widths, join, replace, indent, batch, tojson,
    expandtabs, repeated ~ and +, nested macros and squared integers: refused by the
    sandbox before they build it (each built 32 MB or more; with the issue's numbers a
    gigabyte)."""
    tracemalloc.start()
    try:
        with pytest.raises(RenderError, match="refused by the sandbox"):
            body(one(source))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 24 * sandbox.MAX_OUTPUT


def test_loops_are_bounded_in_steps() -> None:
    """Two nested loops of 3,000 (nine million steps; two of 100,000 froze the server)
    are refused past MAX_STEPS; a loop of a few thousand is fine."""
    nested = "{% for a in range(3000) %}{% for b in range(3000) %}{% endfor %}{% endfor %}"
    with pytest.raises(RenderError, match="steps"):
        body(one(nested))
    assert body(one("{% for a in range(5000) %}{% endfor %}done")) == "done"


def test_a_render_has_a_deadline() -> None:
    """A render whose clock passes its deadline stops with a RenderError (the clock here
    moves a second per reading)."""
    ticks = itertools.count()
    budget = sandbox.Budget(seconds=5.0, clock=lambda: float(next(ticks)))
    with sandbox.limited(budget), pytest.raises(RenderError, match="longer than 5 s"):
        body(one("{% for a in range(100000) %}{{ a }}{% endfor %}"))


def test_compiling_a_template_evaluates_nothing() -> None:
    """Making a type (what loading kirim.toml does, for every command) folds no constant:
    a template that would build 64 MB costs nothing until it is rendered, then is
    refused (it was folded at load: every command, kirim list included, peaked near
    1 GB)."""
    source = "{{ ''|center(64000000) }}{{ '%64000000s' % 'x' }}{{ 'y' * 2 }}"
    tracemalloc.start()
    try:
        ntype = one(source)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4_000_000
    with pytest.raises(RenderError, match="refused by the sandbox"):
        body(ntype)


def test_ordinary_templates_render_as_before() -> None:
    """Loops, macros, filters, formats, joins and concatenation within the bounds."""
    source = (
        "{% macro b(x) %}<{{ x }}>{% endmacro %}"
        "{% for i in items %}{{ b(i) }}{{ loop.index }}{% endfor %}|"
        "{{ items | join(', ') }}|{{ '%05d' % 42 }}|{{ '{:>6}'.format('ab') }}|"
        "{{ name | center(9) }}|{{ 'a' ~ name ~ 'b' }}|{{ name.replace('n', 'N') }}|"
        "{{ items | batch(2, 0) | list }}|{{ 'x' * 3 }}|{{ 2 ** 10 }}|{{ 7 * 6 }}"
    )
    assert body(one(source), {"items": [1, 2, 3], "name": "ana"}) == (
        "<1>1<2>2<3>3|1, 2, 3|00042|    ab|   ana   |aanab|aNa|[[1, 2], [3, 0]]|xxx|1024|42"
    )


@settings(max_examples=200, deadline=None)
@given(
    width=st.integers(0, 4 * sandbox.MAX_OUTPUT),
    count=st.integers(0, 64),
    form=st.sampled_from(
        [
            "{{{{ 'ab'.ljust({w}) * {c} }}}}",
            "{{{{ '%{w}s' % 'x' }}}}{{{{ 'y' * {c} }}}}",
            "{{{{ ('a' * {w}) | replace('a', 'bb') }}}}",
            "{{{{ range({c}) | join('z' * ({w} // 64 + 1)) }}}}",
            "{{{{ ('q' * ({w} // 8)) ~ ('q' * ({w} // 8)) }}}}",
            "{{{{ ('x\\n' * {c}) | indent({w} // 64) }}}}",
        ]
    ),
)
def test_fuzz_no_template_output_passes_the_bound(width: int, count: int, form: str) -> None:
    """Whatever the sizes, a render either gives at most MAX_OUTPUT characters or is
    refused by the sandbox: never more, never another error."""
    source = form.format(w=width, c=count)
    refused = None
    try:
        out = body(one(source))
    except RenderError as exc:
        refused, out = str(exc), ""
    assert refused is None or "refused by the sandbox" in refused, refused
    assert len(out) <= sandbox.MAX_OUTPUT
