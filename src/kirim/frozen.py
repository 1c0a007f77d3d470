"""A faster ``__init__`` for the frozen dataclasses the worker makes per delivery.

A frozen dataclass's generated ``__init__`` sets each field through
``object.__setattr__(self, name, value)`` (its own ``__setattr__`` refuses), which
looks the name up on the type each time. A delivery makes about a dozen such values
(its claim, job and delivery, intent, message, outcome, finish and result: some 130
fields), so that is several microseconds of the worker's CPU per delivery.

``quick_init`` replaces the generated ``__init__`` of a frozen, slotted dataclass with
one of the same signature (the same fields, order, defaults and keyword-only-ness)
that stores each value through its slot's descriptor directly (about a third less
time per value). Nothing else of the dataclass changes: equality, hashing, ``repr``,
``replace``, pickling and the refusal to assign after construction are its own. It
refuses a class it cannot copy exactly (a field with a default factory or
``init=False``, a ``__post_init__``, fields mixing keyword-only and positional):
``tests/unit/test_frozen.py`` checks the signatures against dataclasses' own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from types import MemberDescriptorType
from typing import Any, TypeVar

__all__ = ["QUICK", "quick_init", "setter"]

C = TypeVar("C", bound=type)

#: each class given a quick ``__init__``, with the one dataclasses made (for the tests)
QUICK: dict[type, Any] = {}


def quick_init(cls: C) -> C:
    """Give the frozen, slotted dataclass ``cls`` an ``__init__`` that sets its slots
    directly (see the module docstring); apply it above ``@dataclass``."""
    params = _params(cls)
    fields = dataclasses.fields(cls)
    scope: dict[str, Any] = {}
    signature = []
    for f in fields:
        scope[f"_set_{f.name}"] = setter(cls, f.name)
        if f.default is dataclasses.MISSING:
            signature.append(f.name)
        else:
            scope[f"_default_{f.name}"] = f.default
            signature.append(f"{f.name}=_default_{f.name}")
    star = "*, " if params == "keyword" and fields else ""
    lines = [
        f"def __init__(self, {star}{', '.join(signature)}):",
        *(f"    _set_{f.name}(self, {f.name})" for f in fields),
    ]
    if not fields:
        lines.append("    pass")
    exec("\n".join(lines), scope)
    init = scope["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    generated = cls.__dict__["__init__"]
    init.__doc__ = generated.__doc__
    init.__annotations__ = dict(generated.__annotations__)
    QUICK[cls] = generated
    type.__setattr__(cls, "__init__", init)
    return cls


def setter(cls: type, name: str) -> Callable[[Any, Any], None]:
    """What sets field ``name`` of a new ``cls`` (one being made: a frozen class refuses
    it afterwards): its slot's descriptor, else ``object.__setattr__`` by name (a class
    without slots). ``rows.evolve``'s copies set their fields this way too."""
    slot = cls.__dict__.get(name)
    if isinstance(slot, MemberDescriptorType):
        set_slot: Callable[[Any, Any], None] = slot.__set__
        return set_slot
    return lambda obj, value: object.__setattr__(obj, name, value)


def _params(cls: type) -> str:
    """``keyword`` or ``positional``: how ``cls``'s fields are passed; raises
    ``TypeError`` for a class whose ``__init__`` ``quick_init`` cannot copy."""
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen or "__slots__" not in cls.__dict__:
        raise TypeError(f"{cls.__qualname__}: not a frozen, slotted dataclass")
    if hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__qualname__}: has a __post_init__")
    fields = dataclasses.fields(cls)
    for f in fields:
        if not f.init or f.default_factory is not dataclasses.MISSING:
            raise TypeError(f"{cls.__qualname__}.{f.name}: init=False or a default factory")
    kinds = {f.kw_only for f in fields}
    if len(kinds) > 1:
        raise TypeError(f"{cls.__qualname__}: keyword-only and positional fields mixed")
    return "keyword" if kinds == {True} else "positional"
