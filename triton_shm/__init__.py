"""triton-shm: a Triton-compatible inference server with a shared-memory data plane."""
__version__ = "2.51.0"  # the Triton protocol level reported by server metadata
