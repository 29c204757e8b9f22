"""Planning before a job runs: memory per GPU, which GPU types fit and what they cost, the price of interruptions,
model shapes, GPU facts, training options, and the spot-trace simulator's model. No training stack is imported here."""
