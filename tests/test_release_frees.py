"""How the front-end gives a worker's output blocks back (``WorkerHandle.frees``): over a
real link, read on the worker's side with the real decoder. Freed blocks ride on the next
frame to the worker; one that no frame carries within RELEASE_DELAY goes in a FREE frame of
its own (an idle worker gets it); RELEASE_BYTES of them go at once."""
from __future__ import annotations

import asyncio

from triton_shm.ipc import protocol
from triton_shm.ipc.link import Link
from triton_shm.ipc.protocol import Op
from triton_shm.supervisor.handle import WorkerHandle
from triton_shm.supervisor.lending import RELEASE_BYTES, RELEASE_DELAY


def scenario(fn):
    """Run an async test body in a fresh event loop, with a handle linked to a worker end."""
    def run():
        async def body():
            ours, theirs, fds = Link.create()
            worker = Link.attach(theirs, fds)
            handle = WorkerHandle("w", None)
            handle._loop = asyncio.get_running_loop()
            handle.link, handle.alive = ours, True
            handle.frees.start(handle._loop)
            try:
                await fn(handle, worker)
            finally:
                ours.close()
                worker.close()
        asyncio.run(body())
    run.__name__ = fn.__name__
    return run


def frames(worker: Link) -> list[protocol.Message]:
    """Every frame the worker has been sent since the last look."""
    out = []
    while (got := worker.recv()) is not None:
        out.append(protocol.decode(got[0]))
    return out


async def past_release_delay() -> None:
    # a timer armed after the handle's, with the same delay, fires after it
    await asyncio.sleep(RELEASE_DELAY)


@scenario
async def test_freed_blocks_ride_on_the_next_frame_and_no_free_frame_follows(handle, worker):
    handle.frees.add([[1, 0, 64], [1, 64, 32]])
    handle.frees.add([[2, 0, 16]])
    assert frames(worker) == []  # they wait for a frame to ride on
    handle.send({"op": "noop"})
    (control,) = frames(worker)
    assert (control.op, control.frees) == (Op.CONTROL, [(1, 0, 64), (1, 64, 32), (2, 0, 16)])
    await past_release_delay()
    assert frames(worker) == []  # the timer found nothing left to send


@scenario
async def test_an_idle_worker_gets_its_frees_alone_after_release_delay(handle, worker):
    handle.frees.add([[1, 0, 64]])
    handle.frees.add([[1, 128, 64]])  # the timer the first armed sends both
    await past_release_delay()
    (free,) = frames(worker)
    assert (free.op, free.frees) == (Op.FREE, [(1, 0, 64), (1, 128, 64)])
    handle.frees.add([[1, 256, 64]])  # the next one arms the timer again
    await past_release_delay()
    (free,) = frames(worker)
    assert (free.op, free.frees) == (Op.FREE, [(1, 256, 64)])


@scenario
async def test_release_bytes_of_frees_go_at_once_and_later_ones_keep_the_timer(handle, worker):
    handle.frees.add([[1, 0, 64]])
    handle.frees.add([[1, 64, RELEASE_BYTES]])
    (free,) = frames(worker)
    assert (free.op, free.frees) == (Op.FREE, [(1, 0, 64), (1, 64, RELEASE_BYTES)])
    handle.frees.add([[2, 0, 8]])
    await past_release_delay()
    (free,) = frames(worker)
    assert (free.op, free.frees) == (Op.FREE, [(2, 0, 8)])


@scenario
async def test_nothing_goes_for_an_empty_release_or_a_dead_worker(handle, worker):
    handle.frees.add([])  # every output was in the client's shared memory
    handle.frees.close()  # the worker died (or stopped)
    handle.frees.add([[1, 0, 64]])  # its arena went with it
    await past_release_delay()
    assert frames(worker) == []
