"""`carpool tune`: the batching settings with the most throughput at a latency objective."""
