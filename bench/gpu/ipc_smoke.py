"""A CUDA IPC handle made in one process, opened in another: run first by bench/gpu/run.sh,
so that a platform that cannot share device memory between processes (a sandbox, a driver
limit) is told apart from a bug of triton-shm's.

    python bench/gpu/ipc_smoke.py

Exits 0 and prints one line when the child read the parent's bytes and the parent read the
child's; otherwise non-zero, naming the step that failed.
"""
from __future__ import annotations

import subprocess
import sys

N = 1 << 20
CHILD = """
import sys, cupy as cp
handle = bytes.fromhex(sys.argv[1])
ptr = cp.cuda.runtime.ipcOpenMemHandle(handle)
view = cp.ndarray(%d, dtype=cp.uint8, memptr=cp.cuda.MemoryPointer(cp.cuda.UnownedMemory(ptr, %d, None, 0), 0))
if not bool((view == 7).all()):
    sys.exit("the child read other bytes than the parent wrote")
view.fill(9)
cp.cuda.runtime.deviceSynchronize()
cp.cuda.runtime.ipcCloseMemHandle(ptr)
""" % (N, N)


def main() -> int:
    try:
        import cupy as cp
        memory = cp.cuda.Memory(N)  # a whole allocation: a handle names one
        array = cp.ndarray(N, dtype=cp.uint8, memptr=cp.cuda.MemoryPointer(memory, 0))
        array.fill(7)
        cp.cuda.runtime.deviceSynchronize()
        handle = bytes(cp.cuda.runtime.ipcGetMemHandle(memory.ptr))
    except Exception as e:  # noqa: BLE001 - reported as the failing step
        print(f"CUDA IPC smoke test: the parent could not export a handle: {type(e).__name__}: {e}")
        return 2
    child = subprocess.run([sys.executable, "-c", CHILD, handle.hex()], capture_output=True, text=True, timeout=60)
    if child.returncode != 0:
        print(f"CUDA IPC smoke test: the child could not use the parent's handle (exit {child.returncode}):\n"
              f"{child.stderr.strip()[-2000:]}")
        return 3
    if not bool((array == 9).all()):
        print("CUDA IPC smoke test: the parent does not see the child's writes")
        return 4
    print(f"CUDA IPC smoke test: a {N}-byte allocation shared both ways between two processes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
