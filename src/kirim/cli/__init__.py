"""The ``kirim`` command: the click group and one module per command family.

``runner`` runs a command (state, exit codes); ``params`` parses its input.
"""

from kirim.cli.group import main

__all__ = ["main"]
