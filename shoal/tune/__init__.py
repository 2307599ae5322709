"""`shoal tune`: find a model's best batching profile on the machine in front of it."""
