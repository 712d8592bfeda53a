"""The front-end's side of the process boundary: where a scheduled batch goes next.

``pool.WorkerPool`` places model instances on workers, turns a batch into one INFER frame
for its instance and the reply back into responses, and supervises the worker processes
(reporting "worker down" and "worker back" to whoever owns model state);
``handle.WorkerHandle`` is one worker: its process, its link (``ipc.link``) and the
memory shared with it. The worker process's own code is ``triton_shm.worker``.
"""
