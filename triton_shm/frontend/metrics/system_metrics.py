"""CPU and GPU readings for the Prometheus metrics, without third-party packages.

CPU: ``/proc/stat`` (utilisation as the busy share of the jiffies elapsed between two
samples) and ``/proc/meminfo`` (used = MemTotal - MemAvailable), as Triton computes them.
GPU: NVML through ctypes (``libnvidia-ml.so.1``); where it cannot be loaded there are
simply no GPU readings. Nothing here raises on a machine that lacks either.
"""
from __future__ import annotations

import ctypes
import logging
import os
from dataclasses import dataclass

log = logging.getLogger("triton_shm.metrics")


# -- CPU ---------------------------------------------------------------------------------
@dataclass(slots=True)
class CpuReading:
    utilization: float        # 0.0 .. 1.0 over the last sampling interval
    memory_total_bytes: int
    memory_used_bytes: int


class CpuSampler:
    """Call :meth:`sample` periodically; the first call has utilisation 0 (no interval yet)."""

    def __init__(self, proc: str = "/proc"):
        self.proc = proc
        self._last: tuple[int, int] | None = None   # (busy, total) jiffies

    @property
    def available(self) -> bool:
        return os.path.exists(os.path.join(self.proc, "stat")) and \
            os.path.exists(os.path.join(self.proc, "meminfo"))

    def _jiffies(self) -> tuple[int, int]:
        with open(os.path.join(self.proc, "stat"), "rb") as f:
            fields = f.readline().split()
        # cpu user nice system idle iowait irq softirq steal guest guest_nice
        if not fields or fields[0] != b"cpu" or len(fields) < 5:
            raise ValueError("unexpected /proc/stat format")
        values = [int(v) for v in fields[1:9]]
        values += [0] * (8 - len(values))
        idle = values[3] + values[4]
        total = sum(values)          # guest time is already included in user/nice
        return total - idle, total

    def _memory(self) -> tuple[int, int]:
        info: dict[str, int] = {}
        with open(os.path.join(self.proc, "meminfo"), "rb") as f:
            for line in f:
                key, _, rest = line.partition(b":")
                parts = rest.split()
                if parts:
                    info[key.decode()] = int(parts[0]) * (1024 if parts[1:2] == [b"kB"] else 1)
        total = info.get("MemTotal", 0)
        available = info.get("MemAvailable", info.get("MemFree", 0))
        return total, max(total - available, 0)

    def sample(self) -> CpuReading | None:
        try:
            busy, total = self._jiffies()
            mem_total, mem_used = self._memory()
        except (OSError, ValueError, IndexError):
            return None
        utilization = 0.0
        if self._last is not None:
            d_busy, d_total = busy - self._last[0], total - self._last[1]
            if d_total > 0:
                utilization = min(max(d_busy / d_total, 0.0), 1.0)
        self._last = (busy, total)
        return CpuReading(utilization, mem_total, mem_used)


# -- GPU (NVML) --------------------------------------------------------------------------
@dataclass(slots=True)
class GpuReading:
    uuid: str
    utilization: float | None = None          # 0.0 .. 1.0
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None
    power_usage_w: float | None = None
    power_limit_w: float | None = None
    energy_j: float | None = None             # since the sampler started


class _Utilization(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


class _Memory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


_NVML_SUCCESS = 0


class NvmlSampler:
    """GPU readings through NVML. ``devices`` are CUDA device ordinals (as ``--gpus``
    names them); they are matched to NVML devices by PCI bus id, so
    ``CUDA_VISIBLE_DEVICES`` is honoured as Triton honours it. ``None`` means every GPU
    NVML sees."""

    def __init__(self, devices: list[int] | None = None, library: str = "libnvidia-ml.so.1"):
        self._nvml = None
        self._handles: list[tuple[str, ctypes.c_void_p]] = []
        self._energy_start: dict[str, int] = {}
        try:
            nvml = ctypes.CDLL(library)
        except OSError:
            log.info("GPU metrics are not available: NVML (%s) cannot be loaded", library)
            return
        try:
            rc = nvml.nvmlInit_v2()
            if rc != _NVML_SUCCESS:
                log.info("GPU metrics are not available: nvmlInit failed (%s)", self._error(nvml, rc))
                return
            self._nvml = nvml
            self._handles = self._open(devices)
        except AttributeError as e:  # a library without the symbols we need
            log.info("GPU metrics are not available: %s", e)
            self._nvml = None
            return
        if not self._handles:
            log.info("GPU metrics: NVML sees no GPU that this server serves")
            return
        for uuid, handle in self._handles:
            energy = ctypes.c_ulonglong(0)
            if self._nvml.nvmlDeviceGetTotalEnergyConsumption(handle, ctypes.byref(energy)) == _NVML_SUCCESS:
                self._energy_start[uuid] = energy.value
        log.info("GPU metrics: reporting %d GPU(s) through NVML", len(self._handles))

    @staticmethod
    def _error(nvml, rc: int) -> str:
        try:
            nvml.nvmlErrorString.restype = ctypes.c_char_p
            return nvml.nvmlErrorString(rc).decode(errors="replace")
        except Exception:  # noqa: BLE001 - diagnostic only
            return f"error {rc}"

    def _open(self, devices: list[int] | None) -> list[tuple[str, ctypes.c_void_p]]:
        nvml = self._nvml
        if nvml is None:
            return []
        handles: list[ctypes.c_void_p] = []
        bus_ids = _cuda_pci_bus_ids(devices) if devices is not None else None
        if bus_ids is not None:
            for bus_id in bus_ids:
                h = ctypes.c_void_p()
                if nvml.nvmlDeviceGetHandleByPciBusId_v2(bus_id, ctypes.byref(h)) == _NVML_SUCCESS:
                    handles.append(h)
        else:
            count = ctypes.c_uint(0)
            if nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) != _NVML_SUCCESS:
                return []
            for i in range(count.value):
                h = ctypes.c_void_p()
                if nvml.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(i), ctypes.byref(h)) == _NVML_SUCCESS:
                    handles.append(h)
        out = []
        for h in handles:
            buf = ctypes.create_string_buffer(96)
            if nvml.nvmlDeviceGetUUID(h, buf, ctypes.c_uint(len(buf))) == _NVML_SUCCESS:
                out.append((buf.value.decode(errors="replace"), h))
        return out

    @property
    def available(self) -> bool:
        return self._nvml is not None and bool(self._handles)

    def sample(self) -> list[GpuReading]:
        nvml = self._nvml
        if nvml is None:
            return []
        readings = []
        for uuid, h in self._handles:
            r = GpuReading(uuid)
            util = _Utilization()
            if nvml.nvmlDeviceGetUtilizationRates(h, ctypes.byref(util)) == _NVML_SUCCESS:
                r.utilization = util.gpu / 100.0
            mem = _Memory()
            if nvml.nvmlDeviceGetMemoryInfo(h, ctypes.byref(mem)) == _NVML_SUCCESS:
                r.memory_total_bytes, r.memory_used_bytes = mem.total, mem.used
            mw = ctypes.c_uint(0)
            if nvml.nvmlDeviceGetPowerUsage(h, ctypes.byref(mw)) == _NVML_SUCCESS:
                r.power_usage_w = mw.value / 1000.0
            mw = ctypes.c_uint(0)
            if nvml.nvmlDeviceGetPowerManagementLimit(h, ctypes.byref(mw)) == _NVML_SUCCESS:
                r.power_limit_w = mw.value / 1000.0
            mj = ctypes.c_ulonglong(0)
            if uuid in self._energy_start and \
                    nvml.nvmlDeviceGetTotalEnergyConsumption(h, ctypes.byref(mj)) == _NVML_SUCCESS:
                r.energy_j = max(mj.value - self._energy_start[uuid], 0) / 1000.0
            readings.append(r)
        return readings

    def close(self) -> None:
        if self._nvml is not None:
            self._nvml.nvmlShutdown()
            self._nvml = None
            self._handles = []


def _cuda_pci_bus_ids(devices: list[int]) -> list[bytes] | None:
    """PCI bus ids of CUDA device ordinals, through the driver API; ``None`` if the
    driver cannot be asked (then every NVML device is reported)."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
        if cuda.cuInit(0) != 0:
            return None
        ids = []
        for ordinal in devices:
            dev = ctypes.c_int(0)
            if cuda.cuDeviceGet(ctypes.byref(dev), ctypes.c_int(ordinal)) != 0:
                continue
            buf = ctypes.create_string_buffer(64)
            if cuda.cuDeviceGetPCIBusId(buf, ctypes.c_int(len(buf)), dev) == 0:
                ids.append(buf.value)
        return ids
    except (OSError, AttributeError):
        return None


if __name__ == "__main__":  # quick check on a machine: python system_metrics.py
    import time
    logging.basicConfig(level=logging.INFO)
    cpu = CpuSampler()
    cpu.sample()
    time.sleep(0.5)
    print(cpu.sample())
    gpu = NvmlSampler()
    print(gpu.sample())
    gpu.close()
