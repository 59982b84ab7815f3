"""FakeNvml's MIG, per-process utilization, power-limit and locked-clock
calls, kept apart so fake_nvml.py stays readable. Same rules as there: the
real binding's names and argument order, errors raised as the driver does,
values only from the FakeGpu a test configures. Constants are reached
through self (FakeNvml carries them), so this module imports nothing of
fake_nvml."""
from __future__ import annotations


class MoreNvml:
    def _mig_of(self, h):
        gpu = h.gpu
        if gpu.instance_ids is None:
            raise self.NVMLError(self.NVML_ERROR_INVALID_ARGUMENT)    # not a MIG handle
        return gpu.instance_ids

    def nvmlDeviceGetHandleByUUID(self, uuid):
        uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
        for h in self.handles:
            if h.gpu.uuid == uuid:
                return h
        raise self.NVMLError(self.NVML_ERROR_NOT_FOUND)

    # -- MIG ---------------------------------------------------------------

    def nvmlDeviceGetMigMode(self, h):
        return list(self._have(self._dev("nvmlDeviceGetMigMode", h).mig_mode))

    def nvmlDeviceGetMaxMigDeviceCount(self, h):
        gpu = self._dev("nvmlDeviceGetMaxMigDeviceCount", h)
        self._have(gpu.mig_mode)
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h, index):
        gpu = self._dev("nvmlDeviceGetMigDeviceHandleByIndex", h)
        if not gpu.mig_mode or gpu.mig_mode[0] != self.NVML_DEVICE_MIG_ENABLE:
            raise self.NVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        if index not in gpu.mig:
            raise self.NVMLError(self.NVML_ERROR_NOT_FOUND)
        return type(h)(gpu.mig[index])

    def nvmlDeviceGetGpuInstanceId(self, h):
        self._dev("nvmlDeviceGetGpuInstanceId", h)
        return self._mig_of(h)[0]

    def nvmlDeviceGetComputeInstanceId(self, h):
        self._dev("nvmlDeviceGetComputeInstanceId", h)
        return self._mig_of(h)[1]

    # -- per-process utilization -------------------------------------------

    def nvmlDeviceGetProcessUtilization(self, h, timeStamp):
        samples = self._have(self._dev("nvmlDeviceGetProcessUtilization", h).process_util)
        # only samples newer than the caller's last-seen time, as the driver gives
        out = [type("Sample", (), {"pid": pid, "timeStamp": ts, "smUtil": sm, "memUtil": 0,
                                   "encUtil": 0, "decUtil": 0})()
               for pid, ts, sm in samples if ts > timeStamp]
        if not out:
            raise self.NVMLError(self.NVML_ERROR_NOT_FOUND)
        return out

    # -- power limit ---------------------------------------------------------

    def nvmlDeviceGetPowerManagementLimit(self, h):
        return self._have(self._dev("nvmlDeviceGetPowerManagementLimit", h).power_limit_mw)

    def nvmlDeviceGetPowerManagementLimitConstraints(self, h):
        gpu = self._dev("nvmlDeviceGetPowerManagementLimitConstraints", h)
        return list(self._have(gpu.power_constraints_mw))

    def nvmlDeviceSetPowerManagementLimit(self, h, limit):
        gpu = self._dev("nvmlDeviceSetPowerManagementLimit", h)
        low, high = self._have(gpu.power_constraints_mw)
        if not low <= limit <= high:
            raise self.NVMLError(self.NVML_ERROR_INVALID_ARGUMENT)
        gpu.power_limit_mw = limit

    # -- clocks ------------------------------------------------------------

    def nvmlDeviceGetSupportedMemoryClocks(self, h):
        return sorted(self._dev("nvmlDeviceGetSupportedMemoryClocks", h).supported_clocks,
                      reverse=True)

    def nvmlDeviceGetSupportedGraphicsClocks(self, h, memoryClockMHz):
        clocks = self._dev("nvmlDeviceGetSupportedGraphicsClocks", h).supported_clocks
        if memoryClockMHz not in clocks:
            raise self.NVMLError(self.NVML_ERROR_INVALID_ARGUMENT)
        return list(clocks[memoryClockMHz])

    def _set_locked(self, func, h, which, low, high):
        gpu = self._dev(func, h)
        if low > high:
            raise self.NVMLError(self.NVML_ERROR_INVALID_ARGUMENT)
        gpu.locked_clocks[which] = (low, high)

    def nvmlDeviceSetGpuLockedClocks(self, h, minGpuClockMHz, maxGpuClockMHz):
        self._set_locked("nvmlDeviceSetGpuLockedClocks", h, "gpu", minGpuClockMHz, maxGpuClockMHz)

    def nvmlDeviceResetGpuLockedClocks(self, h):
        self._dev("nvmlDeviceResetGpuLockedClocks", h).locked_clocks.pop("gpu", None)

    def nvmlDeviceSetMemoryLockedClocks(self, h, minMemClockMHz, maxMemClockMHz):
        self._set_locked("nvmlDeviceSetMemoryLockedClocks", h, "memory", minMemClockMHz,
                   maxMemClockMHz)

    def nvmlDeviceResetMemoryLockedClocks(self, h):
        self._dev("nvmlDeviceResetMemoryLockedClocks", h).locked_clocks.pop("memory", None)
