"""The deterministic schedule explorer: real workers, one seeded schedule at a time.

``kirim explore`` (``command.py``) runs many seeds; ``scenario.run_schedule`` runs
one. See docs/simulate-and-explore.md, "The explorer".
"""
