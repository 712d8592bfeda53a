"""triton-shm: a Triton-compatible inference server with a shared-memory data plane."""
__version__ = "0.1.0"  # this package's release (pyproject.toml reads it from here)
TRITON_PROTOCOL_VERSION = "2.51.0"  # the Triton server level whose protocols we speak; server metadata reports it
