"""PyTorch versions of the corpus cases, one module per family (see corpus_bench.py)."""
