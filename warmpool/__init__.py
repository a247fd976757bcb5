"""warmpool as a library: its engine and tokenizer in the caller's own process, without the server.

- warmpool.inprocess: InProcessEmbedder — a model folder embedded as the engine process embeds it
- warmpool.ray: Embedder — the same in each actor of a Ray Data `map_batches` (`pip install warmpool[ray]`)

Nothing of the appliance imports this package (import-linter's contracts in pyproject.toml).
"""
