"""gRPC on our own HTTP/2 server: libnghttp2 (through ngh2) does HTTP/2, this package
does gRPC's framing, calls, deadlines, compression and limits on the front-end's loop."""
