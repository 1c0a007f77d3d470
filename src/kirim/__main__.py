"""``python -m kirim``: the same command line as ``kirim``."""

from kirim.cli import main

if __name__ == "__main__":
    main(prog_name="kirim")
