"""Logs, metrics and traces, and the names they share."""

from __future__ import annotations

from kirim.model import AttemptStatus

#: a provider request's result, as the log lines, the metrics and the spans name it
RESULT = {
    AttemptStatus.SUCCEEDED: "success",
    AttemptStatus.FAILED_PERMANENT: "failed_permanent",
    AttemptStatus.FAILED_TRANSIENT: "failed_transient",
    AttemptStatus.UNKNOWN: "unknown",
}

__all__ = ["RESULT"]
