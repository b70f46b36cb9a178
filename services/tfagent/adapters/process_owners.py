"""`HostProcessOwners`: attribute GPU processes to allocations on a real host.

Kubernetes: a process's pod UID is read from `/proc/<pid>/cgroup` (the agent runs with `hostPID`).
Local mode: the agent's run registry maps the pids it started to their allocation (`register_pid`).
A pid that is gone or unreadable is simply not attributed (it shows up as drift if it holds VRAM).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from uuid import UUID

from tfagent.core.usage import ProcessSample, WorkerAllocation, owners_by_pod_uid, pod_uid_from_cgroup


class HostProcessOwners:
    """A `ProcessOwners` over `/proc` (or another proc root, for tests) plus the local run registry."""

    def __init__(self, proc_root: Path = Path("/proc")) -> None:
        self._proc_root = proc_root
        self._registered: dict[int, UUID] = {}

    def register_pid(self, pid: int, allocation_id: UUID) -> None:
        self._registered[pid] = allocation_id

    def forget_pid(self, pid: int) -> None:
        self._registered.pop(pid, None)

    def owners(
        self, processes: Sequence[ProcessSample], allocations: Sequence[WorkerAllocation]
    ) -> Mapping[int, UUID]:
        pod_uids: dict[int, str] = {}
        for pid in {process.pid for process in processes} - self._registered.keys():
            try:
                text = (self._proc_root / str(pid) / "cgroup").read_text()
            except OSError:
                continue
            if (pod_uid := pod_uid_from_cgroup(text)) is not None:
                pod_uids[pid] = pod_uid
        return {**owners_by_pod_uid(pod_uids, allocations), **self._registered}
