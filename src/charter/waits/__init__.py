"""The waits room (W1, W2): durable pauses keyed by stable IDs; approvals so far."""
