"""Workers: pull loop, batcher and model adapters (encoder)."""
