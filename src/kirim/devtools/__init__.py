"""Tools for trying kirim out: the demo, the test webhook receiver and the benchmark."""
