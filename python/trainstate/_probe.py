"""What this process is: pid, node id, routable IP, visible GPUs, resources.

The same rules as the Rust manager's probe (``trainstate-manager``'s
``probe.rs``), so a run reported from Python looks like one reported from
Rust:

- ``node_id``: the trimmed ``/etc/machine-id`` when it is a valid name,
  else ``host-`` and the FNV-1a 64 hash (16 hex digits) of the hostname;
- ``node_ip``: the address of the interface that routes to the head (a UDP
  socket is connected, nothing is sent), else ``127.0.0.1``;
- ``gpu_ids``: from ``CUDA_VISIBLE_DEVICES``, else ``NVIDIA_VISIBLE_DEVICES``
  (indexes only: UUIDs, ``all`` and ``none`` give no ids);
- ``resources``: ``CPU`` (the CPUs this worker was given: its affinity
  when narrower than the node, else the node's shared by the node's
  workers) and, when GPUs are visible, ``GPU`` (their number).
"""

import math
import os
import socket
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from ._contract import MAX_GPUS_PER_WORKER, MAX_NAME_LEN


def fnv1a64(data: bytes) -> int:
    """The FNV-1a 64-bit hash of ``data``."""
    value = 0xCBF29CE484222325
    for byte in data:
        value = ((value ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return value


def valid_name(text: str) -> bool:
    """The schema's name rule: non-empty, at most 1,024 characters, no
    control characters."""
    return 0 < len(text) <= MAX_NAME_LEN and not any(
        ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in text
    )


def parse_visible_devices(value: Optional[str]) -> Optional[List[int]]:
    """A ``CUDA_VISIBLE_DEVICES`` value as GPU indexes, or ``None`` when it
    does not list indexes (empty, ``-1``, ``none``, ``all``, UUIDs, MIG)."""
    if value is None or not value.strip():
        return None
    ids: List[int] = []
    for token in value.strip().split(","):
        token = token.strip()
        if not token or not token.isascii() or not token.isdigit():
            return None
        gpu = int(token)
        if gpu > 0xFFFFFFFF:
            return None
        if gpu not in ids:
            ids.append(gpu)
    return ids if len(ids) <= MAX_GPUS_PER_WORKER else None


def gpu_ids(env: Mapping[str, str]) -> List[int]:
    """The GPUs this process sees."""
    for name in ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"):
        if name in env:
            return parse_visible_devices(env[name]) or []
    return []


def hostname(paths: Sequence[str] = ("/proc/sys/kernel/hostname", "/etc/hostname"), env: Optional[Mapping[str, str]] = None) -> str:
    """The first non-empty hostname file, else ``HOSTNAME``, else ``localhost``."""
    for path in paths:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                text = f.read().strip()
        except OSError:
            continue
        if text:
            return text
    text = (env if env is not None else os.environ).get("HOSTNAME", "").strip()
    return text or "localhost"


def node_id(machine_id_path: str = "/etc/machine-id", host: Optional[str] = None) -> str:
    """The machine id, else ``host-`` and the hash of the hostname."""
    try:
        with open(machine_id_path, encoding="utf-8", errors="replace") as f:
            machine_id = f.read().strip()
        if valid_name(machine_id):
            return machine_id
    except OSError:
        pass
    name = host if host is not None else hostname()
    return "host-{:016x}".format(fnv1a64(name.encode("utf-8")))


def route_to(host: str, port: int) -> Tuple[str, Optional[str]]:
    """The local address of the interface that routes to ``host:port``, and
    why it fell back to ``127.0.0.1`` if it did."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
        family, _, _, _, address = infos[0]
        with socket.socket(family, socket.SOCK_DGRAM) as sock:
            sock.connect(address)
            local = sock.getsockname()[0]
        if local in ("0.0.0.0", "::"):
            return "127.0.0.1", "the kernel chose no source address"
        return str(local), None
    except (OSError, IndexError, UnicodeError) as err:
        return "127.0.0.1", str(err)


def cpu_count() -> int:
    """The CPUs this process may use: its affinity, bounded by a cgroup CPU
    quota, as Rust's ``available_parallelism``."""
    try:
        count = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        count = os.cpu_count() or 1
    quota = _cgroup_quota()
    if quota is not None:
        count = min(count, quota)
    return max(count, 1)


def _cgroup_quota() -> Optional[int]:
    try:
        with open("/sys/fs/cgroup/cpu.max", encoding="ascii") as f:
            fields = f.read().split()
        if len(fields) == 2 and fields[0] != "max":
            return max(math.ceil(int(fields[0]) / int(fields[1])), 1)
    except (OSError, ValueError, ZeroDivisionError):
        pass
    return None


def worker_cpus(
    local_world_size: int = 1,
    affinity: Optional[int] = None,
    node: Optional[int] = None,
    quota: Optional[int] = None,
) -> int:
    """The CPUs one worker was given, not the whole node's: those of its
    affinity when the launcher narrowed it below the node's, else the
    node's (bounded by a cgroup CPU quota) shared by the node's
    ``local_world_size`` workers; at least 1. Unset arguments are read
    from this process."""
    if affinity is None:
        try:
            affinity = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            affinity = None
    if node is None:
        node = os.cpu_count() or affinity or 1
    if quota is None:
        quota = _cgroup_quota()
    if affinity is not None and affinity < node:
        given = affinity
        if quota is not None:
            given = min(given, quota)
        return max(given, 1)
    total = node if quota is None else min(node, quota)
    return max(total // max(local_world_size, 1), 1)


def resources(gpus: Sequence[int], local_world_size: int = 1) -> Dict[str, float]:
    """``CPU`` (see :func:`worker_cpus`) and, with visible GPUs, ``GPU``."""
    out: Dict[str, float] = {"CPU": float(worker_cpus(local_world_size))}
    if gpus:
        out["GPU"] = float(len(gpus))
    return out
