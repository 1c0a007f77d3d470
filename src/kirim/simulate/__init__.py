"""``kirim simulate``: a chaos harness that counts what a user would receive.

Real worker processes (kirim's, or the write-up's naive flow in ``naive``) deliver
notifications to a loopback ``Receiver`` while the harness kills and freezes them
mid-send and the receiver is slow, times out and fails; the report says how many
notifications arrived twice, how many were lost and how many were reported in
doubt. ``options`` holds the knobs, ``harness`` runs one simulation, ``report``
prints it, ``naive`` is the baseline worker (``python -m kirim.simulate.naive``).
"""

from __future__ import annotations

from kirim.simulate.options import Latency, SimOptions, parse_latency, parse_rate

__all__ = ["Latency", "SimOptions", "parse_latency", "parse_rate"]
