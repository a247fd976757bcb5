"""Each peer's request bodies: OpenAI and vLLM, Cohere, TEI."""
