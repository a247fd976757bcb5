"""The server's TokenizerPool of a folder, loaded once per run: a load parses the folder's tokenizer
and checks it against its class (~70 ms), and the family, LoRA and ColBERT tests tokenize with the
same few folders dozens of times. A server shares one pool between all its requests too; a test
that changes a folder's files does so before its first tokenizing (a fresh folder, a new key)."""

from __future__ import annotations

import functools

from server.tokenizing.tokenizer import TokenizerPool

pool = functools.cache(TokenizerPool)
