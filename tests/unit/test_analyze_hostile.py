"""``kirim analyze`` on hostile input: one bad line is counted malformed and the rest is
analyzed; no line is longer than ``MAX_LINE``; an input without line ends stops with a
clear error (exit 2), never a crash."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from kirim.analyze import MAX_LINE, MAX_RUN, NoLineEnd, analyze_paths
from kirim.analyze.command import analyze

SEED = Path(__file__).resolve().parents[1] / "fixtures" / "seed.log"


def summary_of(log: Path) -> dict[str, Any]:
    result = CliRunner().invoke(analyze, [str(log), "--format", "json"])
    assert result.exit_code in (0, 1), result.output
    data: dict[str, Any] = json.loads(result.stdout)["summary"]
    return data


def test_deeply_nested_json_is_a_malformed_line(tmp_path: Path) -> None:
    """A JSON line nested 50,000 deep is counted malformed (it raised RecursionError)."""
    log = tmp_path / "nested.log"
    nested = b"[" * 50_000 + b"]" * 50_000 + b"\n" + b'{"a":' * 30_000 + b"1" + b"}" * 30_000
    log.write_bytes(nested + b"\n" + SEED.read_bytes())
    summary = summary_of(log)
    assert summary["malformed_lines"] == 2
    assert summary["duplicates"] >= 1  # the seed is analyzed all the same


def test_a_line_past_the_bound_is_a_malformed_line(tmp_path: Path) -> None:
    """A 4 MB line (which took 10 s in the text report) is counted malformed, whatever
    it holds, and the text report stays quick."""
    long_line = b"event=provider_request notification_id=n9 " + b"a=b " * 1_000_000 + b"\n"
    log = tmp_path / "long.log"
    log.write_bytes(long_line + SEED.read_bytes() + long_line)
    summary = summary_of(log)
    assert summary["malformed_lines"] == 2
    assert summary["notifications"] == 1  # the seed's, not n9
    text = CliRunner().invoke(analyze, [str(log)])
    assert len(text.stdout) < 20 * MAX_LINE


class Zeros(io.RawIOBase):
    """/dev/zero: NUL bytes for ever, no line end."""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        buffer[:] = bytes(len(buffer))
        return len(buffer)


def test_an_input_without_line_ends_stops_with_a_clear_error() -> None:
    """/dev/zero (or any input with no line end in MAX_RUN bytes) raises NoLineEnd
    after MAX_RUN bytes; the command says so and exits 2 (it ran out of memory)."""
    import pytest

    with pytest.raises(NoLineEnd, match="no line end"):
        analyze_paths(["-"], stdin=io.BufferedReader(Zeros()))
    assert MAX_RUN >= 64 * MAX_LINE
    if Path("/dev/zero").exists():
        result = CliRunner().invoke(analyze, ["/dev/zero"])
        assert result.exit_code == 2
        assert "no line end" in result.output
