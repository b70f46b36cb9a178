"""The node agent's worker journal: what a restarted agent finds of the workers the last one ran."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from uuid import uuid4

from tfagent.adapters.worker_journal import JournalEntry, WorkerJournal, process_start_time


def _entry(pid: int, scheduler_url: str | None = "http://127.0.0.1:8080") -> JournalEntry:
    return JournalEntry(
        allocation_id=uuid4(),
        pid=pid,
        process_started=process_start_time(pid),
        argv0="python",
        scheduler_url=scheduler_url,
        grace_s=10.0,
    )


def test_a_recorded_worker_is_found_again_until_forgotten(tmp_path: Path) -> None:
    journal = WorkerJournal(tmp_path / "workers" / "node-1")
    http_started, bus_started = _entry(os.getpid()), _entry(os.getpid(), scheduler_url=None)
    journal.record(http_started)
    journal.record(bus_started)

    again = WorkerJournal(tmp_path / "workers" / "node-1")
    assert sorted(again.entries(), key=str) == sorted([http_started, bus_started], key=str)

    again.forget(http_started.allocation_id)
    assert again.entries() == [bus_started]


def test_an_unreadable_entry_is_dropped_not_fatal(tmp_path: Path) -> None:
    journal = WorkerJournal(tmp_path)
    (tmp_path / f"{uuid4()}.json").write_text("{broken")

    assert journal.entries() == []
    assert list(tmp_path.iterdir()) == []


def test_an_unwritable_folder_is_logged_and_the_worker_still_runs(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    journal = WorkerJournal(blocker / "workers")

    journal.record(_entry(os.getpid()))

    assert journal.entries() == []


def test_a_process_that_ended_has_no_start_time_so_it_is_never_signalled() -> None:
    child = subprocess.Popen(["sleep", "30"])
    try:
        assert isinstance(process_start_time(child.pid), int)
    finally:
        child.kill()
        child.wait()
    assert process_start_time(child.pid) is None
