"""The worker process: hosts model instances and runs batches on tensors in shared memory.

The front-end's side of the boundary (placing instances, sending batches, supervision) is
``triton_shm.supervisor``."""
