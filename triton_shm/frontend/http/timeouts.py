"""The HTTP server's connection timeouts, one set for the aiohttp and the lean path."""

KEEPALIVE_TIMEOUT = 75.0  # seconds: an idle connection, a stalled body, a client that stopped reading
HEADER_TIMEOUT = 30.0     # seconds from a request's first byte to the end of its headers
# Seconds a connection without a request in progress may still send one once the server
# stops (a client that has just connected is about to): it is answered, then closed.
STOP_GRACE = 1.0
