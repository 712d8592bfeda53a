"""The protocol-neutral core: model repository, request validation, scheduling to
workers. Protocol adapters call :class:`~triton_shm.core.service.InferenceService`."""
