"""``python -m kirim.receiver``: the test webhook receiver, kept at this name.

The receiver is ``kirim.devtools.receiver``; this module only runs it.
"""

from kirim.devtools.receiver import main

if __name__ == "__main__":
    raise SystemExit(main())
