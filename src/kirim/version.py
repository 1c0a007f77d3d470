"""kirim's version (``kirim.__version__``), readable from any layer."""

__version__ = "0.1.0"
