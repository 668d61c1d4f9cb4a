"""The benchmark suite: ricochet against a raw aio-pika loop on the same broker (make bench)."""
