"""The quick ``__init__`` of the per-delivery values is the one dataclasses made."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import pytest

# the modules whose values get a quick __init__ (imported: they register them)
import kirim.model
import kirim.providers.base
import kirim.store.base
import kirim.worker.decisions
from kirim.frozen import QUICK, quick_init

CLASSES = sorted(QUICK, key=lambda cls: cls.__qualname__)


def test_the_per_delivery_values_are_quick() -> None:
    """The values the worker makes per delivery have the quick ``__init__``."""
    names = {cls.__qualname__ for cls in QUICK}
    assert {"Delivery", "Job", "Claim", "Intent", "Finish", "FinishResult", "Message"} <= names


@pytest.mark.parametrize("cls", CLASSES, ids=lambda cls: cls.__qualname__)
def test_same_signature_as_the_dataclass_init(cls: type) -> None:
    """Same parameters, order, kinds, defaults and annotations as the generated
    ``__init__``."""
    mine = inspect.signature(cls.__init__)  # type: ignore[misc]
    theirs = inspect.signature(QUICK[cls])
    assert [(p.name, p.kind, p.default, p.annotation) for p in mine.parameters.values()] == [
        (p.name, p.kind, p.default, p.annotation) for p in theirs.parameters.values()
    ]
    assert mine.return_annotation == theirs.return_annotation


@pytest.mark.parametrize("cls", CLASSES, ids=lambda cls: cls.__qualname__)
def test_same_values_as_the_dataclass_init(cls: type) -> None:
    """Each field holds what was passed (a distinct value per field), as with the
    generated ``__init__``; omitted fields hold their defaults."""
    fields = dataclasses.fields(cls)
    given = {f.name: object() for f in fields}
    made = cls(**given)
    theirs = object.__new__(cls)
    QUICK[cls](theirs, **given)
    assert [getattr(made, f.name) for f in fields] == [getattr(theirs, f.name) for f in fields]
    assert [getattr(made, f.name) for f in fields] == list(given.values())
    required = {f.name: given[f.name] for f in fields if f.default is dataclasses.MISSING}
    bare = cls(**required)
    for f in fields:
        assert getattr(bare, f.name) is (given[f.name] if f.name in required else f.default)


def test_still_frozen_and_compared_by_value() -> None:
    """Assignment after construction is still refused; equality is the dataclass's."""
    job = kirim.model.Job(
        id=1,
        delivery_id=2,
        status=kirim.model.JobStatus.QUEUED,
        run_at=0.0,
        attempts=0,
        max_attempts=3,
        lease_owner=None,
        lease_token=None,
        lease_expires_at=None,
        last_error=None,
        created_at=0.0,
        updated_at=0.0,
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.attempts = 1  # type: ignore[misc]
    assert dataclasses.replace(job, attempts=1) == dataclasses.replace(job, attempts=1)
    with pytest.raises(TypeError):
        kirim.model.Job(id=1)  # type: ignore[call-arg]


def _plain() -> Any:
    @dataclasses.dataclass(frozen=True)
    class Plain:
        x: int

    return Plain


def _factory() -> Any:
    @dataclasses.dataclass(frozen=True, slots=True)
    class Factory:
        x: list[int] = dataclasses.field(default_factory=list)

    return Factory


def _post_init() -> Any:
    @dataclasses.dataclass(frozen=True, slots=True)
    class Post:
        x: int

        def __post_init__(self) -> None:
            pass

    return Post


@pytest.mark.parametrize("make", [_plain, _factory, _post_init])
def test_refuses_what_it_cannot_copy(make: Any) -> None:
    """A class that is not slotted, has a default factory or a ``__post_init__``."""
    with pytest.raises(TypeError):
        quick_init(make())


@pytest.mark.parametrize(
    "cls", [kirim.model.Delivery, kirim.model.Job, kirim.model.Attempt], ids=lambda c: c.__name__
)
def test_evolve_is_dataclasses_replace(cls: type) -> None:
    """``rows.evolve`` (slots set through their descriptors) makes what ``replace`` makes:
    the changed fields new, every other field the original's."""
    from kirim.store.rows import evolve

    fields = dataclasses.fields(cls)
    original = cls(**{f.name: object() for f in fields})
    changes = {f.name: object() for f in fields[::2]}
    made = evolve(original, **changes)
    assert type(made) is cls
    assert made == dataclasses.replace(original, **changes)
    for f in fields:
        assert getattr(made, f.name) is changes.get(f.name, getattr(original, f.name))


def test_evolve_of_a_class_without_slots() -> None:
    """A frozen dataclass without slots is evolved by name (``object.__setattr__``)."""
    from kirim.store.rows import evolve

    made = evolve(_plain()(x=1), x=2)
    assert made.x == 2
