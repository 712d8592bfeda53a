"""What the server tells about itself: per-model statistics, request tracing (Triton's
trace files and OpenTelemetry spans: ``tracing``, ``otel``) and the log settings."""
