"""Process attribution on a host: pod UID from the cgroup file, or the local run registry."""

from __future__ import annotations

from pathlib import Path
from uuid import uuid4

from builders import a_share, an_allocation
from tfagent.adapters.process_owners import HostProcessOwners
from tfagent.core.usage import ProcessSample


def test_attributes_pids_by_their_pod_cgroup_and_by_registration(tmp_path: Path) -> None:
    allocation = an_allocation(a_share())
    assert allocation.workload.uid is not None
    pod_cgroup = f"0::/kubepods/besteffort/pod{allocation.workload.uid}/abc\n"
    (tmp_path / "41").mkdir()
    (tmp_path / "41" / "cgroup").write_text(pod_cgroup)
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "cgroup").write_text("0::/user.slice/session-1.scope\n")
    local_run = uuid4()
    owners = HostProcessOwners(proc_root=tmp_path)
    owners.register_pid(43, local_run)
    processes = [ProcessSample("gpu-aaaa", pid, 1) for pid in (41, 42, 43, 44)]

    assert owners.owners(processes, [allocation]) == {41: allocation.allocation_id, 43: local_run}

    owners.forget_pid(43)
    assert owners.owners(processes, [allocation]) == {41: allocation.allocation_id}
