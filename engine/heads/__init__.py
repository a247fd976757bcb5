"""What follows the encoder, one module per output: pooling, Dense, SPLADE, ColBERT, bge-m3."""
