"""Running a model: KV cache, sampling, the token generator, the Engine."""
