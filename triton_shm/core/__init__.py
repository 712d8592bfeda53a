"""The protocol-neutral core. Protocol adapters call
:class:`~triton_shm.core.service.InferenceService`; below it, by concern: ``models/``
(where a model is loaded, and a request checked against it), ``scheduling/`` (where a
request is queued, batched and handed to the workers), ``data/`` (the request and
response types, tensor bytes, client shared memory, the response cache) and
``observability/`` (statistics, tracing, log settings)."""
