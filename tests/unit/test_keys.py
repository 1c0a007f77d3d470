"""The default idempotency key: the same as before for plain fields, never ambiguous."""

from __future__ import annotations

import hashlib

from hypothesis import given
from hypothesis import strategies as st

from kirim.keys import default_key, default_key_text, new_request_id, new_token, text_problem


def _old_key(event_id: str, recipient: str, channel: str) -> str:
    """The formula of kirim's first releases (fields joined unescaped)."""
    raw = f"event:{event_id}:user:{recipient}:channel:{channel}"
    return hashlib.sha256(raw.encode()).hexdigest()


def _unescaped(field: str) -> str:
    return field.replace("%3A", ":").replace("%25", "%")


#: fields made of the characters that matter: separators, escapes, label words
_FIELD = st.lists(
    st.sampled_from([":", "%", "%3A", "%25", "3A", "25", "user", "channel", "event", "a", "é"]),
    max_size=6,
).map("".join) | st.text(max_size=8)
_TRIPLE = st.tuples(_FIELD, _FIELD, _FIELD)


def test_plain_fields_keep_the_key_they_had() -> None:
    """Fields without % or : give exactly the key of the old formula."""
    for triple in [("48291", "1007", "push"), ("order-7", "user 42", "e-mail"), ("é", "u", "c")]:
        assert default_key(*triple) == _old_key(*triple)


def test_a_colon_in_a_field_no_longer_collides() -> None:
    """("order-7:user:42", "43") and ("order-7", "42:user:43") collided; now they differ."""
    first, second = ("order-7:user:42", "43", "push"), ("order-7", "42:user:43", "push")
    assert _old_key(*first) == _old_key(*second)  # the defect, as it was
    assert default_key(*first) != default_key(*second)


def test_the_escaping_of_percent_and_colon() -> None:
    """% is written %25 first, then : is written %3A, inside each field."""
    text = default_key_text("a:%3A", "%", "c")
    assert text == "event:a%3A%253A:user:%25:channel:c"
    assert default_key("a:%3A", "%", "c") == hashlib.sha256(text.encode()).hexdigest()


@given(_TRIPLE, _TRIPLE)
def test_distinct_triples_give_distinct_texts(a, b) -> None:
    """Two triples give the same pre-hash text only if they are the same triple."""
    assert (default_key_text(*a) == default_key_text(*b)) == (a == b)


@given(_TRIPLE)
def test_the_text_splits_back_into_its_fields(triple) -> None:
    """The pre-hash text decodes to its three fields: the encoding is injective."""
    parts = default_key_text(*triple).split(":")
    assert [parts[0], parts[2], parts[4], len(parts)] == ["event", "user", "channel", 6]
    assert (_unescaped(parts[1]), _unescaped(parts[3]), _unescaped(parts[5])) == triple


def test_text_problem_names_nul_and_lone_surrogates() -> None:
    """NUL and lone surrogates cannot be stored as text by every backend; the rest can."""
    assert text_problem("a\x00b") == "must not contain NUL characters"
    assert text_problem("a\ud800") == "must be valid Unicode text (no lone surrogates)"
    assert text_problem("plain é 😀") is None


def test_tokens_and_request_ids_are_version_4_uuids() -> None:
    """A claim token is the hex of a random version-4 UUID (as ``uuid4().hex``), a
    request id the same after ``req-``; no two of a thousand are the same."""
    import uuid

    tokens = [new_token() for _ in range(1000)]
    ids = [new_request_id() for _ in range(1000)]
    for token in tokens:
        made = uuid.UUID(hex=token)
        assert made.hex == token
        assert (made.version, made.variant) == (4, uuid.RFC_4122)
    for request_id in ids:
        assert request_id.startswith("req-")
        assert uuid.UUID(hex=request_id[4:]).version == 4
    assert len(set(tokens)) == 1000
    assert len(set(ids)) == 1000


def test_a_forked_process_makes_other_request_ids() -> None:
    """Request ids come from the process's random generator: a forked child (a worker
    process) draws other ids than its parent does after the fork."""
    import os

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next id to the parent, then gone
        os.write(write, new_request_id().encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    child = os.read(read, 64).decode()
    os.close(read)
    assert child.startswith("req-")
    assert child != new_request_id()


def test_an_applications_seed_does_not_repeat_request_ids() -> None:
    """Request ids come from kirim's own generator: an application that seeds Python's
    (``random.seed``, in every process alike) does not make two draw the same ids."""
    import random

    state = random.getstate()
    try:
        random.seed(7)
        first = new_request_id()
        random.seed(7)
        assert new_request_id() != first
    finally:
        random.setstate(state)
