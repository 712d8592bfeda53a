"""triton-shm: a Triton-compatible inference server with a shared-memory data plane."""
__version__ = "0.1.0"  # this package's release (pyproject.toml reads it from here)
# the Triton release whose protocols and features we match; server metadata reports it
# (docs/compatibility.md says what matches and what differs)
TRITON_PROTOCOL_VERSION = "2.71.0"
