"""Pull-consumer loop: fetch in batches, run a handler, publish its events, then ack."""
