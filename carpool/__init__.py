"""carpool: dynamic request batching for PyTorch model serving on Kubernetes."""
