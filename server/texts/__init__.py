"""Text inputs before tokenizing: prompts, long inputs in windows, late chunking."""
