"""Model layer: torch, transformers and faiss code with no Spark in it.

Everything here is testable with plain tensors, lists and pandas frames.
"""
