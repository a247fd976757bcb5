"""Tokenizers: the per-thread pool of fast tokenizers, SigLIP's from sentencepiece's model."""
