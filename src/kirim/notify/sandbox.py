"""The sandbox templates render in: Jinja's immutable sandbox, bounded in what a template
makes and in the work it does.

A template is the operator's code, but the data it is given is a client's, and a
template that can build a gigabyte or loop for hours from one request is a way to stop
a server. So:

- **What a template makes.** No value it builds holds more than ``MAX_OUTPUT``
  characters (or items): each operation that could make more is checked *before* it
  runs (``*``, ``+``, ``%`` and ``~``, ``str.ljust``/``center``/``zfill``/``replace``/
  ``join``/``expandtabs``/``translate``/``format``, the filters ``center``, ``indent``,
  ``format``, ``join``, ``replace``, ``wordwrap``, ``batch``, ``slice``, ``tojson``,
  ``urlize`` and ``sum``), and every other call's and filter's result after; the
  output of a template, a macro or a block is joined by a bounded ``concat``. An
  integer holds at most ``MAX_BITS`` bits.
- **The work it does.** Each loop iteration, call and filter is a step of the current
  ``Budget`` (one per render, or one for a whole event: ``limited``): at most
  ``MAX_STEPS`` steps and ``MAX_SECONDS`` of the clock.
- **Nothing at load.** Jinja folds constant expressions when it compiles a template;
  this environment does not (``optimized=False``, and no output is made a constant), so
  loading kirim.toml compiles its templates without evaluating any of them.

Past a bound, Jinja's ``SecurityError``: ``kirim.notify.templates.render`` makes it a
``RenderError`` ("refused by the sandbox: ...").
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import re
import string
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from functools import update_wrapper, wraps
from typing import Any

from jinja2 import nodes
from jinja2.compiler import CodeGenerator, Frame
from jinja2.exceptions import SecurityError
from jinja2.runtime import Context, Undefined
from jinja2.sandbox import (
    ImmutableSandboxedEnvironment,
    SandboxedEscapeFormatter,
    SandboxedFormatter,
)
from markupsafe import Markup, escape

#: the most characters (or items) one value a template builds may hold
MAX_OUTPUT = 1_000_000
#: the most steps (loop iterations, calls, filters) of one budget
MAX_STEPS = 1_000_000
#: the longest a budget may run, in seconds of its clock
MAX_SECONDS = 2.0
#: the largest power ``**`` may take, and the most bits an integer may hold
MAX_EXPONENT = 1_000
MAX_BITS = 100_000


class Budget:
    """The steps and time one render (or one event's renders) may take."""

    __slots__ = ("clock", "deadline", "seconds", "steps", "taken")

    def __init__(
        self,
        *,
        steps: int = MAX_STEPS,
        seconds: float = MAX_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.steps = steps
        self.seconds = seconds
        self.clock = clock
        self.deadline = clock() + seconds
        self.taken = 0

    def step(self) -> None:
        """One more step: ``SecurityError`` past the steps or the deadline."""
        self.taken += 1
        if self.taken > self.steps:
            raise SecurityError(f"a render of more than {self.steps} steps is refused")
        if self.clock() > self.deadline:
            raise SecurityError(f"a render that takes longer than {self.seconds:g} s is refused")


_CURRENT: contextvars.ContextVar[Budget | None] = contextvars.ContextVar(
    "kirim_template_budget", default=None
)


def current() -> Budget:
    """The budget of the render in progress (a fresh one outside any)."""
    found = _CURRENT.get()
    if found is None:
        found = Budget()
        _CURRENT.set(found)
    return found


@contextlib.contextmanager
def limited(budget: Budget | None = None) -> Iterator[Budget]:
    """Render within ``budget`` (a fresh one by default) until the block ends; a
    budget already in force is kept (an event's, for each of its renders)."""
    if budget is None and (found := _CURRENT.get()) is not None:
        yield found
        return
    token = _CURRENT.set(budget or Budget())
    try:
        yield _CURRENT.get() or Budget()
    finally:
        _CURRENT.reset(token)


# -- sizes -----------------------------------------------------------------------------


def size(n: int, what: str = "a text or list") -> None:
    """``SecurityError`` when ``n`` characters (or items) are over ``MAX_OUTPUT``."""
    if n > MAX_OUTPUT:
        raise SecurityError(f"{what} of more than {MAX_OUTPUT} characters is refused")


def _bits(n: int) -> None:
    if n > MAX_BITS:
        raise SecurityError(f"an integer of more than {MAX_BITS} bits is refused")


def checked(value: Any) -> Any:
    """``value`` after a check of its length (a text, a list, a mapping)."""
    if isinstance(value, str | list | tuple | dict | set | bytes):
        size(len(value))
    elif isinstance(value, int) and not isinstance(value, bool):
        _bits(value.bit_length())
    return value


def _int(value: Any, default: int = 0) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


#: a printf conversion: its width and precision (digits, or * from the arguments)
_PRINTF = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\*|\d+)?(?:\.(\*|\d+))?[hlL]?[a-zA-Z%]")
#: a format spec's width and precision (after its fill and alignment)
_SPEC = re.compile(r"^(?:.?[<>=^])?[-+ ]?z?#?0?(\d*)[,_]?(?:\.(\d+))?")


def check_printf(fmt: str, args: Any) -> None:
    """``fmt % args`` makes at most ``MAX_OUTPUT`` characters (widths and precisions, a
    ``*`` taking its number from ``args``)."""
    star = any(m.group(1) == "*" or m.group(2) == "*" for m in _PRINTF.finditer(fmt))
    for m in _PRINTF.finditer(fmt):
        for part in m.groups():
            if part and part != "*":
                size(int(part), "a printf width")
    if star:
        for arg in args if isinstance(args, tuple) else (args,):
            if isinstance(arg, int) and not isinstance(arg, bool):
                size(abs(arg), "a printf width")


def check_spec(spec: str) -> None:
    """A ``format`` spec's width and precision within ``MAX_OUTPUT``."""
    found = _SPEC.match(spec)
    if found is not None:
        for part in found.groups():
            if part:
                size(int(part), "a format width")


class _BoundedFormatter(SandboxedFormatter):
    def format_field(self, value: Any, format_spec: str) -> Any:
        check_spec(format_spec)
        return checked(super().format_field(value, format_spec))


class _BoundedEscapeFormatter(SandboxedEscapeFormatter):
    def format_field(self, value: Any, format_spec: str) -> Any:
        check_spec(format_spec)
        return checked(super().format_field(value, format_spec))


# -- str methods -----------------------------------------------------------------------


def _check_str_method(text: str, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """What a str method could make, checked before it runs; returns the ``args`` to
    call it with (``join``'s iterable made a list, to be measured)."""
    if name in ("ljust", "rjust", "center", "zfill"):
        size(_int(args[0] if args else kwargs.get("width")))
    elif name == "expandtabs":
        tab = _int(args[0] if args else kwargs.get("tabsize", 8), 8)
        size(len(text) + text.count("\t") * max(tab, 0))
    elif name == "replace" and len(args) >= 2:
        old, new = args[0], args[1]
        if isinstance(old, str) and isinstance(new, str):
            times = text.count(old) if old else len(text) + 1
            limit = _int(args[2] if len(args) > 2 else kwargs.get("count", -1), -1)
            if limit >= 0:
                times = min(times, limit)
            size(len(text) + times * max(len(new) - len(old), 0))
    elif name == "join" and args:
        items = list(args[0])
        size(len(items), "a join")
        size(sum(len(i) for i in items if isinstance(i, str)) + len(text) * len(items))
        return (items, *args[1:])
    elif name == "translate" and args and isinstance(args[0], Mapping):
        longest = max((len(v) for v in args[0].values() if isinstance(v, str)), default=1)
        size(len(text) * max(longest, 1))
    return args


# -- filters ---------------------------------------------------------------------------


def _indent(s: Any, width: Any = 4, *_: Any, **__: Any) -> None:
    pad = len(width) if isinstance(width, str) else _int(width, 4)
    text = str(s)
    size(len(text) + (text.count("\n") + 1) * max(pad, 0))


def _join(value: Any, d: Any = "", attribute: Any = None) -> tuple[Any, ...]:
    """The items made a list (an iterator is measured, then given to the filter)."""
    items = list(value)
    size(len(items), "a join")
    sep = len(d) if isinstance(d, str) else 0
    text = sum(len(i) for i in items if isinstance(i, str)) if attribute is None else 0
    size(text + sep * max(len(items) - 1, 0))
    return (items, d, attribute)


def _replace(s: Any, old: Any = "", new: Any = "", count: Any = None) -> None:
    if isinstance(s, str) and isinstance(old, str) and isinstance(new, str):
        _check_str_method(s, "replace", (old, new, -1 if count is None else count), {})


def _wordwrap(s: Any, width: Any = 79, break_long: Any = True, wrapstring: Any = None,
              *_: Any, **kw: Any) -> None:  # fmt: skip
    wrap = kw.get("wrapstring", wrapstring)
    if isinstance(s, str) and isinstance(wrap, str):
        lines = len(s) // max(_int(kw.get("width", width), 79), 1) + s.count("\n") + 1
        size(len(s) + lines * len(wrap))


def _filled(value: Any, count: Any = 0, fill_with: Any = None) -> None:
    size(_int(count), "a batch or slice")


def _tojson(value: Any, indent: Any = None) -> None:
    step = _int(indent)
    if step:
        compact = json.dumps(value, default=str)
        size(len(compact) * (1 + step))


def _urlize(value: Any, *args: Any, **kwargs: Any) -> None:
    extra = sum(len(v) for v in (*args, *kwargs.values()) if isinstance(v, str))
    size((len(str(value)) + 1) * (4 + extra))


def _sum(iterable: Any, attribute: Any = None, start: Any = 0) -> None:
    if isinstance(start, list | tuple | str) and isinstance(iterable, list | tuple):
        size(len(start) + sum(len(i) for i in iterable if isinstance(i, list | tuple | str)))


def _format(value: Any, *args: Any, **kwargs: Any) -> None:
    if isinstance(value, str):
        check_printf(value, args if args else kwargs)


#: filters that could make more than they are given: checked before they run (a check
#: may give the arguments to call the filter with instead: ``join``'s iterator, listed)
PRECHECKS: dict[str, Callable[..., tuple[Any, ...] | None]] = {
    "center": lambda value, width=80: size(_int(width, 80)),
    "indent": _indent,
    "format": _format,
    "join": _join,
    "replace": _replace,
    "wordwrap": _wordwrap,
    "batch": _filled,
    "slice": _filled,
    "tojson": _tojson,
    "urlize": _urlize,
    "sum": _sum,
}


#: the filters made to be given a missing variable (``{{ x | default('-') }}``)
_TAKE_UNDEFINED = frozenset({"default", "d"})


def bounded_filter(name: str, func: Callable[..., Any]) -> Callable[..., Any]:
    """``func`` (a filter) as a step of the budget, its arguments checked first when it
    is one of ``PRECHECKS``, its result after; a missing variable given to it raises
    the error that names the variable (``'total' is undefined``), except for
    ``default``. Jinja's ``pass_context`` and the like are kept (the first argument is
    then the context, not the value)."""
    precheck = PRECHECKS.get(name)
    passes = getattr(func, "jinja_pass_arg", None) is not None
    strict = name not in _TAKE_UNDEFINED

    @wraps(func)
    def bounded(*args: Any, **kwargs: Any) -> Any:
        current().step()
        if strict:
            for value in (*(args[1:] if passes else args), *kwargs.values()):
                if isinstance(value, Undefined):  # a missing variable: named, not a
                    value._fail_with_undefined_error()  # filter's "Undefined is not..."
        if precheck is not None:
            head, given = (args[:1], args[1:]) if passes else ((), args)
            if (instead := precheck(*given, **kwargs)) is not None:
                args = (*head, *instead)
        return checked(func(*args, **kwargs))

    return bounded


def counted(iterable: Iterable[Any]) -> Iterator[Any]:
    """A loop's items, each one a step of the budget (every ``{% for %}`` is wrapped)."""
    budget = current()
    for item in iterable:
        budget.step()
        yield item


def concat(parts: Iterable[str]) -> str:
    """A template's, macro's or block's output joined, at most ``MAX_OUTPUT`` long."""
    kept: list[str] = []
    total = 0
    for part in parts:
        total += len(part)
        size(total, "a template's output")
        kept.append(part)
    return "".join(kept)


def concat_args(markup: bool, args: tuple[Any, ...]) -> str:
    """``a ~ b ~ c``: each operand as text (escaped when ``markup``), then joined within
    ``MAX_OUTPUT``."""
    parts = [escape(a) if markup else str(a) for a in args]
    size(sum(len(p) for p in parts), "a concatenation")
    return Markup("").join(parts) if markup else "".join(parts)


# -- the environment -------------------------------------------------------------------


class _Generator(CodeGenerator):
    """Jinja's code generator without constant outputs (no evaluation at compile time)
    and with ``~`` joined by ``concat_args``."""

    def _output_child_to_const(self, node: nodes.Expr, frame: Frame, finalize: Any) -> str:
        if not isinstance(node, nodes.TemplateData):
            raise nodes.Impossible()
        return super()._output_child_to_const(node, frame, finalize)

    def visit_Concat(self, node: nodes.Concat, frame: Frame) -> None:
        if frame.eval_ctx.volatile:
            markup = "context.eval_ctx.volatile"
        else:
            markup = repr(bool(frame.eval_ctx.autoescape))
        self.write(f"environment.concat_args({markup}, (")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


class Sandbox(ImmutableSandboxedEnvironment):
    """Jinja's immutable sandbox, bounded (see the module's docstring)."""

    code_generator_class = _Generator
    intercepted_binops = frozenset({"*", "**", "%", "+"})
    concat = staticmethod(concat)
    concat_args = staticmethod(concat_args)

    def __init__(self, **options: Any) -> None:
        super().__init__(optimized=False, **options)
        self.filters = {name: bounded_filter(name, f) for name, f in self.filters.items()}

    def _parse(self, source: str, name: str | None, filename: str | None) -> nodes.Template:
        """The template's tree, every loop's items counted (``counted``)."""
        tree = super()._parse(source, name, filename)
        for loop in tree.find_all(nodes.For):
            loop.iter = nodes.Call(
                nodes.ImportedName(f"{__name__}.counted"), [loop.iter], [], None, None
            )
            loop.iter.set_lineno(loop.lineno)
        return tree

    def call(
        __self,
        __context: Context,
        __obj: Any,
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        current().step()
        bound_to = getattr(__obj, "__self__", None)
        if isinstance(bound_to, str):
            args = _check_str_method(bound_to, getattr(__obj, "__name__", ""), args, kwargs)
        return checked(super().call(__context, __obj, *args, **kwargs))

    def call_binop(self, context: Context, operator: str, left: Any, right: Any) -> Any:
        current().step()
        ints = all(isinstance(x, int) and not isinstance(x, bool) for x in (left, right))
        if operator == "**" and ints:
            if abs(right) > MAX_EXPONENT:
                raise SecurityError(f"a power above {MAX_EXPONENT} is refused")
            _bits(left.bit_length() * max(right, 0))
        elif operator == "*":
            if ints:
                _bits(left.bit_length() + right.bit_length())
            for seq, times in ((left, right), (right, left)):
                if isinstance(seq, str | list | tuple) and isinstance(times, int):
                    size(len(seq) * times, "a repetition")
        elif operator == "+" and isinstance(left, str | list | tuple) and hasattr(right, "__len__"):
            size(len(left) + len(right))
        elif operator == "%" and isinstance(left, str):
            check_printf(left, right)
        return checked(super().call_binop(context, operator, left, right))

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        """``str.format`` and ``format_map`` with each field's width checked."""
        if getattr(value, "__name__", None) not in ("format", "format_map"):
            return None
        text = getattr(value, "__self__", None)
        if not isinstance(text, str):
            return None
        is_map = value.__name__ == "format_map"
        formatter: string.Formatter
        if isinstance(text, Markup):
            formatter = _BoundedEscapeFormatter(self, escape=text.escape)
        else:
            formatter = _BoundedFormatter(self)

        def wrapper(*args: Any, **kwargs: Any) -> str:
            if is_map:
                if kwargs or len(args) != 1:
                    raise TypeError("format_map() takes exactly one argument")
                kwargs, args = args[0], ()
            return type(text)(checked(formatter.vformat(text, args, kwargs)))

        return update_wrapper(wrapper, value)
