"""One GPU pool per machine: a leg leases whole devices, and no two leases ever hold the same one.

Each device has a lock file (`<lock_dir>/gpu<index>.lock`) held with `fcntl.flock` for as long as
the lease lasts. flock belongs to the open file, so the lock goes when the holder's process does,
however it ends (a crash, SIGKILL): no stale lock to clean up. While held, the file names its
holder, so a leg left waiting says who holds what.

A lease asks for N devices; it takes them all or none (no device is kept while waiting for the
rest, so two multi-device leases cannot deadlock), waits a bounded time, and yields the child's
`CUDA_VISIBLE_DEVICES` and a `GpuLease` record (devices, holder, when asked/acquired/released,
how long it waited, on whom) that goes beside the leg's receipts.

No Dagster here: `resources.gpu.LocalGpuLegRunner` is the skin.
"""

from __future__ import annotations

import datetime as _dt
import fcntl
import json
import os
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from tica.errors import TicaError

# Machine-wide by default: every TICA process on the box (any DAGSTER_HOME, any user) shares one
# pool. A per-instance folder would let two instances hand out the same device.
DEFAULT_LOCK_DIR = Path("/tmp/tica-gpu-locks")
NVIDIA_SMI_QUERY = ["nvidia-smi", "--query-gpu=index,uuid,name", "--format=csv,noheader"]


class GpuPoolError(TicaError):
    """The pool cannot give a leg the devices it asked for."""


class NoGpuFound(GpuPoolError):
    """Discovery found no device (no nvidia-smi, or it lists none)."""


class GpuPoolTooSmall(GpuPoolError):
    """A leg asks for more devices than the pool has: it could never run, so it fails at once."""


class GpuPoolBusy(GpuPoolError):
    """The wait ran out while other holders kept the devices."""

    def __init__(self, message: str, busy: list["DeviceHolder"]) -> None:
        self.busy = busy
        super().__init__(message)


class GpuDevice(BaseModel):
    model_config = ConfigDict(frozen=True)

    index: int = Field(ge=0, description="nvidia-smi's index (PCI bus order)")
    uuid: str | None = None
    name: str | None = None


class DeviceHolder(BaseModel):
    """Who held a device when a lease found it taken (read from its lock file)."""

    index: int
    holder: str | None = None
    pid: int | None = None
    host: str | None = None
    since: str | None = None


class GpuLease(BaseModel):
    """One leg's hold on its devices, as recorded beside its receipts."""

    devices: list[GpuDevice]
    cuda_visible_devices: str
    holder: str
    pid: int
    host: str
    requested: int
    pool: list[int]
    lock_dir: str
    locking: bool = True
    asked_at: str
    acquired_at: str
    released_at: str | None = None
    waited_s: float
    held_s: float | None = None
    waited_on: list[DeviceHolder] = Field(default_factory=list)

    @property
    def indices(self) -> list[int]:
        return [d.index for d in self.devices]

    def child_env(self) -> dict[str, str]:
        """What the leg's process needs to see exactly its devices. nvidia-smi numbers devices in
        PCI bus order; CUDA's default order is fastest first, so the order is pinned."""
        env = {"CUDA_VISIBLE_DEVICES": self.cuda_visible_devices, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
        uuids = [d.uuid for d in self.devices if d.uuid]
        if len(uuids) == len(self.devices):
            env["TICA_GPU_LEASE_UUIDS"] = ",".join(uuids)
        return env


class GpuPoolConfig(BaseModel):
    devices: list[GpuDevice] = Field(min_length=1)
    lock_dir: Path = DEFAULT_LOCK_DIR
    wait_timeout_s: float = Field(3600.0, ge=0)
    poll_s: float = Field(0.2, gt=0)
    # False only for the negative control: leases no longer exclude one another.
    locking: bool = True


class LeaseOverlap(BaseModel):
    index: int
    first: str
    second: str
    start: str
    end: str


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat()


def _ts(iso: str) -> float:
    return _dt.datetime.fromisoformat(iso).timestamp()


def parse_nvidia_smi(text: str) -> list[GpuDevice]:
    devices = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 3 or not parts[0].isdigit():
            raise NoGpuFound(f"nvidia-smi printed a line that is not 'index, uuid, name': {line!r}")
        devices.append(GpuDevice(index=int(parts[0]), uuid=parts[1], name=",".join(parts[2:]).strip()))
    return devices


def discover_gpus(run: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> list[GpuDevice]:
    """Every device `nvidia-smi --query-gpu=index,uuid,name` lists; NoGpuFound if none."""
    try:
        proc = run(NVIDIA_SMI_QUERY, capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        raise NoGpuFound("no GPU pool: nvidia-smi is not on PATH; list the devices in the pool's config") from None
    except subprocess.TimeoutExpired:
        raise NoGpuFound("no GPU pool: nvidia-smi did not answer within 30 s") from None
    if proc.returncode != 0:
        raise NoGpuFound(f"no GPU pool: `{' '.join(NVIDIA_SMI_QUERY)}` exited {proc.returncode}: "
                         f"{(proc.stderr or proc.stdout or '').strip()[:300]}")
    devices = parse_nvidia_smi(proc.stdout)
    if not devices:
        raise NoGpuFound("no GPU pool: nvidia-smi lists no device")
    return devices


def overlapping_leases(leases: list[GpuLease]) -> list[LeaseOverlap]:
    """Every pair of leases that held the same device at the same time (never, with locking)."""
    out = []
    for i, a in enumerate(leases):
        for b in leases[i + 1:]:
            start = max(a.acquired_at, b.acquired_at, key=_ts)
            end = min(a.released_at or now(), b.released_at or now(), key=_ts)
            if _ts(start) >= _ts(end):
                continue
            for index in sorted(set(a.indices) & set(b.indices)):
                out.append(LeaseOverlap(index=index, first=a.holder, second=b.holder, start=start, end=end))
    return out


class _Lock:
    """One device's lock file, held open while locked."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd: int | None = None
        self.writable = False

    def try_acquire(self) -> bool:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
            self.writable = True
        except PermissionError:  # another user's lock file: flock needs no write access
            fd = os.open(self.path, os.O_RDONLY)
            self.writable = False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self.fd = fd
        return True

    def write_holder(self, record: dict) -> None:
        if self.fd is None or not self.writable:
            return
        data = json.dumps(record).encode()
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, data, 0)

    def release(self) -> None:
        if self.fd is None:
            return
        try:
            if self.writable:
                os.ftruncate(self.fd, 0)  # the next reader finds no holder named
        finally:
            os.close(self.fd)  # closing the only descriptor drops the flock
            self.fd = None


def read_holder(path: Path, index: int) -> DeviceHolder:
    try:
        data = json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        data = {}
    return DeviceHolder(index=index, **{k: data.get(k) for k in ("holder", "pid", "host", "since")})


class GpuPool:
    def __init__(self, config: GpuPoolConfig) -> None:
        self.config = config
        indices = [d.index for d in config.devices]
        if len(set(indices)) != len(indices):
            raise GpuPoolError(f"GPU pool lists a device twice: {indices}")

    @property
    def indices(self) -> list[int]:
        return [d.index for d in self.config.devices]

    def lock_path(self, index: int) -> Path:
        return self.config.lock_dir / f"gpu{index}.lock"

    def holders(self) -> list[DeviceHolder]:
        """Who holds each device now (holder None: free, or held by a pool with locking off)."""
        return [read_holder(self.lock_path(i), i) for i in self.indices]

    def _prepare_dir(self) -> None:
        d = self.config.lock_dir
        if not d.is_dir():
            d.mkdir(parents=True, exist_ok=True)
            if d == DEFAULT_LOCK_DIR:
                os.chmod(d, 0o1777)  # shared by every user's processes, like /tmp

    @contextmanager
    def lease(self, n: int, holder: str, timeout_s: float | None = None) -> Iterator[GpuLease]:
        """Hold n devices for the duration of the block; the record's released_at/held_s are
        filled in when it ends."""
        if n < 1:
            raise GpuPoolError(f"a leg must ask for at least one GPU, asked for {n}")
        if n > len(self.indices):
            raise GpuPoolTooSmall(
                f"{holder}: asks for {n} GPU(s), the pool has {len(self.indices)} "
                f"(devices {self.indices}); it could never run here")
        timeout = self.config.wait_timeout_s if timeout_s is None else timeout_s
        self._prepare_dir()
        asked, t0 = now(), time.monotonic()
        waited_on: list[DeviceHolder] = []
        while True:
            taken, busy = self._try_take(n)
            if taken is not None:
                break
            if not waited_on:
                waited_on = busy
            if time.monotonic() - t0 >= timeout:
                named = "; ".join(
                    f"GPU {b.index} held by {b.holder or 'an unnamed holder'}"
                    + (f" (pid {b.pid} on {b.host}, since {b.since})" if b.pid else "") for b in busy)
                raise GpuPoolBusy(
                    f"{holder}: waited {timeout:g} s for {n} free GPU(s) of {self.indices} in "
                    f"{self.config.lock_dir}; busy: {named}", busy)
            time.sleep(self.config.poll_s)
        acquired = now()
        waited = time.monotonic() - t0
        devices = [d for d in self.config.devices if d.index in {i for i, _ in taken}]
        record = GpuLease(
            devices=devices, cuda_visible_devices=",".join(str(d.index) for d in devices), holder=holder,
            pid=os.getpid(), host=socket.gethostname(), requested=n, pool=self.indices,
            lock_dir=str(self.config.lock_dir), locking=self.config.locking, asked_at=asked,
            acquired_at=acquired, waited_s=round(waited, 3), waited_on=waited_on)
        for _, lock in taken:
            if lock is not None:
                lock.write_holder({"holder": holder, "pid": record.pid, "host": record.host, "since": acquired})
        try:
            yield record
        finally:
            record.released_at = now()
            record.held_s = round(_ts(record.released_at) - _ts(acquired), 3)
            for _, lock in taken:
                if lock is not None:
                    lock.release()

    def _try_take(self, n: int) -> tuple[list[tuple[int, _Lock | None]] | None, list[DeviceHolder]]:
        """n devices locked at once, or None and who holds the others (nothing kept)."""
        if not self.config.locking:
            return [(i, None) for i in self.indices[:n]], []
        taken: list[tuple[int, _Lock | None]] = []
        busy: list[DeviceHolder] = []
        for index in self.indices:
            lock = _Lock(self.lock_path(index))
            if lock.try_acquire():
                taken.append((index, lock))
                if len(taken) == n:
                    return taken, []
            else:
                busy.append(read_holder(lock.path, index))
        for _, lock in taken:
            lock.release()
        return None, busy
