"""Client shared-memory regions registered through the shared-memory extensions.

The front-end opens a system region (``/dev/shm/<key>``, what ``shm_open`` does on
Linux), checks its size with ``fstat`` and keeps only the file descriptor. It never
creates, truncates or unlinks a client's region, and never maps it: the worker that
runs a request receives the fd over its socket and maps exactly
``[offset, offset + byte_size)`` (the response cache alone reads and writes one from the
front-end, with ``pread``/``pwrite``: ``region_io.py``).

Unregistering a region that in-flight requests use is deferred, as in Triton: the call
succeeds at once, the region stays registered (listed by status, usable, its name taken:
a new registration of it gets ALREADY_EXISTS) marked ``awaiting``, and goes when its last
user releases it (``on_idle`` is told, so several front-end processes can settle it
together: core/service.py).
"""
from __future__ import annotations

import base64
import itertools
import os
import stat
from dataclasses import dataclass
from typing import Callable

from ...errors import AlreadyExists, InvalidArgument, NotFound, Unsupported
from ...ipc.arena import INTERNAL_PREFIX

SHM_DIR = "/dev/shm"
# Keys a client may never register: our own segments and Triton python backend's.
RESERVED_KEY_PREFIXES = (INTERNAL_PREFIX, "triton_python_backend_shm_region_")
CUDA_IPC_HANDLE_SIZE = 64  # sizeof(cudaIpcMemHandle_t)
DISABLED_MESSAGE = ("Client shared memory is disabled. Start the server with '--allow-client-shm=true' "
                    "to enable.")
NO_GPU_MESSAGE = ("CUDA shared memory needs a GPU and CuPy (pip install 'triton-shm[gpu]'); this server "
                  "runs no GPU")


@dataclass(eq=False)
class Region:
    id: int
    name: str
    key: str
    offset: int
    byte_size: int
    fd: int  # -1 for a CUDA region
    users: int = 0
    registered: bool = True
    awaiting: bool = False  # unregistered while in use: goes when its last user releases it
    kind: str = "system"  # or "cuda"
    device_id: int = 0  # CUDA regions: the GPU the memory lives on
    raw_handle: bytes = b""  # CUDA regions: the cudaIpcMemHandle_t, opened by the worker of device_id

    def cuda_registration(self) -> dict:
        """A CUDA region as another front-end process registers it too (``raw_handle`` in
        base64, as clients send it)."""
        return {"name": self.name, "raw_handle": base64.b64encode(self.raw_handle).decode(),
                "device_id": self.device_id, "byte_size": self.byte_size}

    def status(self) -> dict:
        if self.kind == "cuda":
            return {"name": self.name, "device_id": self.device_id, "byte_size": self.byte_size}
        return {"name": self.name, "key": self.key, "offset": self.offset, "byte_size": self.byte_size}


def _check_key(key: object) -> str:
    """The object name under /dev/shm for a client key, or InvalidArgument."""
    if not isinstance(key, str) or "\x00" in key:
        raise InvalidArgument("shared memory key must be a string without NUL bytes")
    name = key.lstrip("/")
    if not name:
        raise InvalidArgument(f"invalid shared memory key '{key}'")
    if "/" in name or name in (".", ".."):
        raise InvalidArgument(f"invalid shared memory key '{key}': a POSIX shared memory name has no "
                              "'/' after its leading slash")
    if any(name.startswith(p) for p in RESERVED_KEY_PREFIXES):
        raise InvalidArgument(f"shared memory key '{key}' uses a prefix reserved for the server")
    return name


def _check_extent(offset, byte_size, what: str) -> tuple[int, int]:
    for label, v in (("offset", offset), ("byte_size", byte_size)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0 or v >= 1 << 63:
            raise InvalidArgument(f"{what}: '{label}' must be a non-negative 64-bit integer")
    return offset, byte_size


class SharedMemoryRegistry:
    def __init__(self, enabled: bool, gpus: list[int]):
        self.enabled = enabled
        self.gpus = gpus
        self._regions: dict[str, Region] = {}
        self._ids = itertools.count(1)
        # called with a region once it is gone (unregistered and unused)
        self.on_close: Callable[[Region], None] | None = None
        # called with an awaiting region once its last user released it; None: it goes then
        self.on_idle: Callable[[Region], None] | None = None

    def _require_enabled(self) -> None:
        if not self.enabled:
            raise Unsupported(DISABLED_MESSAGE)

    # -- registration --------------------------------------------------------------------
    def register_system(self, name: str, key: object, offset: object, byte_size: object) -> None:
        self._require_enabled()
        self._check_name(name)
        obj = _check_key(key)
        offset, byte_size = _check_extent(offset, byte_size, f"shared memory region '{name}'")
        try:
            fd = os.open(os.path.join(SHM_DIR, obj), os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as e:
            raise InvalidArgument(f"Unable to open shared memory region: '{key}': {e.strerror}") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise InvalidArgument(f"Invalid shared memory region: '{key}' is not a shared memory object")
            if offset > st.st_size or byte_size > st.st_size - offset:  # no overflow: compare to what remains
                raise InvalidArgument(
                    f"Invalid shared memory region: '{key}': offset {offset} + byte_size {byte_size} exceeds "
                    f"its size {st.st_size}")
        except BaseException:
            os.close(fd)
            raise
        self._regions[name] = Region(next(self._ids), name, str(key), offset, byte_size, fd)

    def prepare_cuda(self, name: str, raw_handle: bytes | str, device_id: object, byte_size: object) -> Region:
        """A checked CUDA region, not yet registered: the worker of its device opens the
        handle first (``add_cuda``), so a handle that does not open is never listed."""
        self._require_enabled()
        self._check_name(name)
        if isinstance(raw_handle, str):
            try:
                raw_handle = base64.b64decode(raw_handle, validate=True)
            except ValueError:
                raise InvalidArgument("'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t") from None
        if len(raw_handle) != CUDA_IPC_HANDLE_SIZE:
            raise InvalidArgument(f"'raw_handle' must be a {CUDA_IPC_HANDLE_SIZE}-byte cudaIpcMemHandle_t, "
                                  f"got {len(raw_handle)} bytes")
        _, size = _check_extent(0, byte_size, f"shared memory region '{name}'")
        if not self.gpus:  # INVALID_ARGUMENT, as Triton's CPU build answers
            raise InvalidArgument(f"failed to register CUDA shared memory region '{name}': {NO_GPU_MESSAGE}")
        if isinstance(device_id, bool) or not isinstance(device_id, int) or device_id not in self.gpus:
            raise InvalidArgument(f"failed to register CUDA shared memory region '{name}': device_id "
                                  f"{device_id} is not a GPU this server runs (it runs {self.gpus})")
        return Region(next(self._ids), name, "", 0, size, -1, kind="cuda", device_id=device_id,
                      raw_handle=bytes(raw_handle))

    def add_cuda(self, region: Region) -> None:
        self._check_name(region.name)  # a registration of the same name may have won meanwhile
        self._regions[region.name] = region

    def _check_name(self, name: str) -> None:
        if not isinstance(name, str) or not name or "\x00" in name:
            raise InvalidArgument("shared memory region name must be a non-empty string")
        if name in self._regions:
            raise AlreadyExists(f"shared memory region '{name}' already in manager")

    def cuda_registrations(self) -> list[dict]:
        """Every CUDA region not awaiting its unregistration, as ``Region.cuda_registration``
        gives it."""
        return [r.cuda_registration() for r in self._regions.values() if r.kind == "cuda" and not r.awaiting]

    # -- status and removal --------------------------------------------------------------
    def status(self, kind: str, name: str = "", *, awaiting: bool = True) -> list[dict]:
        """Registered regions of ``kind`` ("system" or "cuda"; names are shared by both),
        those awaiting their unregistration included unless ``awaiting`` is False."""
        regions = {n: r for n, r in self._regions.items() if r.kind == kind and (awaiting or not r.awaiting)}
        if name:
            if name not in regions:
                raise NotFound(f"Unable to find {kind} shared memory region: '{name}'")
            return [regions[name].status()]
        return [r.status() for r in regions.values()]

    def unregister(self, kind: str, name: str = "", *, defer_all: bool = False) -> list[str]:
        """One region, or every region of ``kind``; an unknown name is not an error (as
        Triton). A region in use is marked awaiting and kept until its last user releases
        it; ``defer_all``: every one is (the front-end processes decide together when it
        goes: ``drop_idle``). The names of the regions kept because they are in use here."""
        self._require_enabled()
        in_use = []
        for n in [name] if name else list(self._regions):
            region = self._regions.get(n)
            if region is None or region.kind != kind:
                continue
            if region.users or defer_all:
                region.awaiting = True
                if region.users:
                    in_use.append(n)
            else:
                self._drop(region)
        return in_use

    def drop_idle(self, kind: str, name: str = "", keep: frozenset[str] | set[str] = frozenset()) -> None:
        """Remove the awaiting regions of ``kind`` (``name``, or all) that nothing here uses,
        but those named in ``keep`` (in use in another front-end process)."""
        for n in [name] if name else list(self._regions):
            region = self._regions.get(n)
            if region is not None and region.kind == kind and region.awaiting and not region.users and n not in keep:
                self._drop(region)

    def still_awaiting(self, region: Region) -> bool:
        """``region`` is registered, awaiting its unregistration."""
        return region.awaiting and self._regions.get(region.name) is region

    def _drop(self, region: Region) -> None:
        if self._regions.get(region.name) is region:
            del self._regions[region.name]
        region.registered = False
        if region.users == 0:
            self._close(region)

    # -- use by requests -----------------------------------------------------------------
    def acquire(self, name: str) -> Region:
        region = self._regions.get(name) if isinstance(name, str) else None
        if region is None:
            raise NotFound(f"Unable to find shared memory region: '{name}'")
        region.users += 1
        return region

    def acquire_all(self, plan) -> dict[str, Region]:
        """Take a reference on every region a request's plan uses (checking each slice
        lies inside its region); region name -> Region."""
        regions: dict[str, Region] = {}
        try:
            for ref in [*plan.shm_inputs.values(), *plan.shm_outputs.values()]:
                region = regions.get(ref.region)
                if region is None:
                    region = regions[ref.region] = self.acquire(ref.region)
                if ref.offset > region.byte_size or ref.byte_size > region.byte_size - ref.offset:
                    raise InvalidArgument(f"Invalid offset + byte size for shared memory region: '{ref.region}'")
        except BaseException:
            for region in regions.values():
                self.release(region)
            raise
        return regions

    def release(self, region: Region) -> None:
        region.users -= 1
        if region.users:
            return
        if not region.registered:
            self._close(region)
        elif region.awaiting:  # unregistered while in use: it goes now
            if self.on_idle is None:
                self._drop(region)
            else:
                self.on_idle(region)

    def _close(self, region: Region) -> None:
        if self.on_close is not None:
            self.on_close(region)
        if region.fd >= 0:
            os.close(region.fd)
            region.fd = -1

    def close(self) -> None:
        for region in list(self._regions.values()):
            region.registered = False
            self._close(region)
        self._regions.clear()
