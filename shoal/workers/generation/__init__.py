"""Generation workers: continuous batching on transformers, or a supervised SGLang server."""
