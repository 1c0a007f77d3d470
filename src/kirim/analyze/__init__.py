"""``kirim analyze``: find duplicate sends, overlapping attempts and late status writes in logs.

>>> report = analyze_paths(["worker.log.gz"])  # doctest: +SKIP
>>> report.summary.duplicates, report.exit_code  # doctest: +SKIP

Everything streams: memory is bounded by the notifications still open, not by file size.
"""

from __future__ import annotations

import gc
import gzip
import io
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import IO

from kirim.analyze.detect import AnalyzeOptions, Detector
from kirim.analyze.report import Gap, Incident, Report, Summary

__all__ = [
    "MAX_LINE",
    "MAX_RUN",
    "AnalyzeOptions",
    "Detector",
    "Gap",
    "Incident",
    "NoLineEnd",
    "ProgressCallback",
    "Report",
    "Summary",
    "analyze_lines",
    "analyze_paths",
    "iter_lines",
    "open_binary",
]

#: Called now and then with (source name, bytes read so far, total bytes or ``None``).
ProgressCallback = Callable[[str, int, int | None], None]
_PROGRESS_EVERY = 1 << 16
#: the longest line analyzed (characters); a longer one is counted malformed, unread
MAX_LINE = 64 * 1024
#: the most characters read without a line end before the input is given up on
MAX_RUN = 64 * 1024 * 1024
#: what a line past MAX_LINE is analyzed as: a line the parser counts malformed
_TOO_LONG = "\x00 (a line longer than MAX_LINE)\n"


class NoLineEnd(ValueError):
    """The input ran ``MAX_RUN`` characters without a line end (``/dev/zero``): it is
    not a log."""


class _Prefixed(io.RawIOBase):
    """A raw stream that replays already-read ``head`` bytes before the rest of ``tail``."""

    def __init__(self, head: bytes, tail: IO[bytes]) -> None:
        super().__init__()
        self._head = head
        self._tail = tail

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        if self._head:
            size = min(len(buffer), len(self._head))
            buffer[:size] = self._head[:size]
            self._head = self._head[size:]
            return size
        data = self._tail.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


def open_binary(stream: IO[bytes]) -> IO[bytes]:
    """Wrap ``stream`` so gzip data (detected by its magic bytes) reads decompressed."""
    peek = getattr(stream, "peek", None)
    if peek is not None:
        head: bytes = peek(2)[:2]
    else:
        head = stream.read(2)
        stream = io.BufferedReader(_Prefixed(head, stream))
    if head == b"\x1f\x8b":
        return gzip.GzipFile(fileobj=stream, mode="rb")  # type: ignore[return-value]
    return stream


@contextmanager
def _text(stream: IO[bytes]) -> Iterator[io.TextIOWrapper]:
    """A text view of ``stream`` (gunzipped if needed) that leaves ``stream`` itself open."""
    binary = open_binary(stream)
    # Lines end at \n alone, as kirim writes them: a carriage return, NEL or U+2028
    # inside a line (text a client sent) does not start a line of its own.
    text = io.TextIOWrapper(binary, encoding="utf-8", errors="surrogateescape", newline="\n")
    try:
        yield text
    finally:
        text.detach()
        if binary is not stream:
            binary.close()  # the gzip or prefix wrapper, not the caller's stream


def iter_lines(stream: IO[bytes]) -> Iterator[str]:
    """Yield text lines of a (possibly gzip) binary stream; bad bytes become surrogates."""
    with _text(stream) as text:
        yield from _bounded(text)


def _bounded(text: io.TextIOWrapper, name: str = "the input") -> Iterator[str]:
    """The lines of ``text``, each at most ``MAX_LINE`` characters: a longer one is
    skipped to its end and given as a line the parser counts malformed. ``NoLineEnd``
    after ``MAX_RUN`` characters without a line end."""
    readline = text.readline
    while line := readline(MAX_LINE + 1):
        if len(line) <= MAX_LINE or line[-1] == "\n":
            yield line
            continue
        run = len(line)
        while (rest := readline(MAX_LINE)) and rest[-1] != "\n":
            run += len(rest)
            if run > MAX_RUN:
                raise NoLineEnd(f"{name}: no line end in {MAX_RUN} characters: not a log")
        yield _TOO_LONG


@contextmanager
def _fewer_collections() -> Iterator[None]:
    """Collect young objects less often while analyzing (restored afterwards).

    The detector keeps many small long-lived objects; CPython's default gen-0 threshold
    (700) makes the cyclic GC cost about a fifth of the run time.
    """
    before = gc.get_threshold()
    gc.set_threshold(max(before[0], 100_000), *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)


def analyze_lines(lines: Iterable[str], *, options: AnalyzeOptions | None = None) -> Report:
    """Analyze an iterable of log lines (logfmt or JSON, one record each)."""
    detector = Detector(options)
    feed = detector.feed
    with _fewer_collections():
        for line in lines:
            feed(line)
        return detector.finish()


def _feed_stream(
    detector: Detector,
    name: str,
    stream: IO[bytes],
    progress: ProgressCallback | None,
    total: int | None,
) -> None:
    feed = detector.feed
    with _text(stream) as text:
        lines = _bounded(text, name)
        if progress is None or not stream.seekable():
            for line in lines:
                feed(line)
            return
        for count, line in enumerate(lines, 1):
            feed(line)
            if not count & (_PROGRESS_EVERY - 1):
                progress(name, stream.tell(), total)
    progress(name, total or stream.tell(), total)


def analyze_paths(
    paths: Sequence[str | os.PathLike[str]],
    *,
    options: AnalyzeOptions | None = None,
    stdin: IO[bytes] | None = None,
    progress: ProgressCallback | None = None,
) -> Report:
    """Analyze log files in order as one stream; ``-`` reads ``stdin`` (default: sys.stdin).

    Files may be plain text or gzip (detected by magic bytes).  ``OSError``,
    ``EOFError`` (truncated gzip) and ``NoLineEnd`` propagate to the caller.
    """
    detector = Detector(options)
    with _fewer_collections():
        for path in paths:
            name = os.fspath(path)
            if name == "-":
                _feed_stream(detector, "<stdin>", stdin or sys.stdin.buffer, progress, None)
                continue
            with open(name, "rb") as handle:
                total = os.fstat(handle.fileno()).st_size
                _feed_stream(detector, name, handle, progress, total)
        return detector.finish()
