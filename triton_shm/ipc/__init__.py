"""Inter-process plumbing between the front-end and its workers: shared-memory arenas for
tensor bytes and a socket channel for the small control messages that describe them."""
