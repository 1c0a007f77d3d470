"""kirim: notification delivery that never sends the same notification twice."""
