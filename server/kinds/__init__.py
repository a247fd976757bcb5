"""What an output kind needs beyond a dense vector: bge-m3's three outputs, inference-free sparse
queries, ColBERT's token vectors."""
