"""The node agent's journal of running `tfctl run` workers: one small JSON file per worker on disk.

A worker is written down when it starts and struck out once its allocation is released. Whatever is
still written down when the agent starts again was left by an agent that died or could not release
(the scheduler was already gone): the new agent stops any of those processes that still run and
releases their allocations (`WorkerRunner.recover`). A process is recognised by its pid *and* its start
time in `/proc`, so a recycled pid is never signalled.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from uuid import UUID

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class JournalEntry:
    """One worker as written down: its allocation, process group and how its allocation is released.

    `scheduler_url` is set for a worker started over HTTP (`tfctl run`: released through the scheduler's
    API); None for one started by a bus command (released in the ledger).
    """

    allocation_id: UUID
    pid: int
    process_started: int | None
    argv0: str
    scheduler_url: str | None
    grace_s: float


def process_start_time(pid: int) -> int | None:
    """The start time of `pid` in clock ticks since boot (field 22 of `/proc/PID/stat`), None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()
    if len(fields) < 20 or fields[0] == "Z":
        return None
    return int(fields[19])


class WorkerJournal:
    """The folder `TF_AGENT_STATE_DIR/workers/<node>`; a file `<allocation id>.json` per running worker.

    Writing never stops a worker from running: a folder that cannot be written is logged once and the
    journal then keeps nothing (the agent still stops and releases its workers when it stops cleanly).
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._warned = False

    def record(self, entry: JournalEntry) -> None:
        payload = {**asdict(entry), "allocation_id": str(entry.allocation_id)}
        path = self._path(entry.allocation_id)
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            temporary = path.with_suffix(".tmp")
            temporary.write_text(json.dumps(payload) + "\n", encoding="utf-8")
            os.replace(temporary, path)
        except OSError as error:
            if not self._warned:
                self._warned = True
                log.warning(
                    "cannot write the worker journal in %s (%s); a worker left by a crash will not be "
                    "released at the next start: set TF_AGENT_STATE_DIR to a writable folder",
                    self.folder,
                    error.strerror,
                    extra={"event": "agent.worker_journal", "outcome": "error"},
                )

    def forget(self, allocation_id: UUID) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._path(allocation_id).unlink()

    def entries(self) -> list[JournalEntry]:
        """Every worker still written down; an unreadable file is logged and removed."""
        found: list[JournalEntry] = []
        try:
            paths = sorted(self.folder.glob("*.json"))
        except OSError:
            return found
        for path in paths:
            try:
                raw = json.loads(path.read_text(encoding="utf-8"))
                found.append(
                    JournalEntry(
                        allocation_id=UUID(str(raw["allocation_id"])),
                        pid=int(raw["pid"]),
                        process_started=None
                        if raw["process_started"] is None
                        else int(raw["process_started"]),
                        argv0=str(raw["argv0"]),
                        scheduler_url=None if raw["scheduler_url"] is None else str(raw["scheduler_url"]),
                        grace_s=float(raw["grace_s"]),
                    )
                )
            except (OSError, ValueError, KeyError, TypeError) as error:
                log.warning(
                    "worker journal entry %s unreadable (%s); removed",
                    path,
                    error,
                    extra={"outcome": "error"},
                )
                with contextlib.suppress(OSError):
                    path.unlink()
        return found

    def _path(self, allocation_id: UUID) -> Path:
        return self.folder / f"{allocation_id}.json"
