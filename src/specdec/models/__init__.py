"""Model backends: load weights, run forward with a KV cache, roll back."""
