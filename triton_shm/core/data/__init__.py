"""What a request carries: the request and response types (``types``; C classes in
``_types.pyx``), datatypes, the BYTES codec, client shared-memory regions (``shm_registry``,
``region_io``) and the response cache (``response_cache``, ``cached_inference``)."""
