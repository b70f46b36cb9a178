"""The scheduler's placement policies, one per placement mode, with the target workload they aim for
learned from the recent submissions (`tfscheduler.core.learning.RecentWorkload`).

`learn` counts each new submission once (a batch the ledger abandoned and recorded again is not counted
twice), relearns when enough are new, and starts new policies only when the target changed: what they
need (the default policy's card values, about 0.1 s of CPU) is computed in a worker thread first, so
placing is not stalled, and the policies in use are swapped afterwards.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from uuid import UUID

from tfcommon.placement import PlacementRequestError, PluginArgs, Profile, policy, prepare_policy_inputs

from tfscheduler.core.learning import RecentWorkload, same_target
from tfscheduler.core.view import placement_request
from tfscheduler.workloads import StoredWorkload

log = logging.getLogger("tfscheduler")
RECENT_REQUESTS = 2048
"""How many of the latest submissions the fragmentation-aware policies learn their target workload from."""
RELEARN_EVERY = 256
"""Submissions between two relearnings once warmed up (before that: at 1, 2, 4, ... submissions)."""


class LearnedPolicies:
    """Each pool's policy (by its placement mode, `mode_of(pool)`), learning its target workload."""

    def __init__(self, mode_of: Callable[[str], str], *, name: str) -> None:
        self.mode_of = mode_of
        self.name = name
        self._profiles: dict[str, Profile] = {}
        self._recent = RecentWorkload(RECENT_REQUESTS, RELEARN_EVERY)
        self._plugin_args = PluginArgs()
        self._learned: PluginArgs | None = None
        self._last_learned: set[UUID] = set()
        self._relearning: asyncio.Task[None] | None = None

    def profile(self, pool: str) -> Profile:
        """The pool's policy, with the target workload learned from the recent submissions."""
        mode = self.mode_of(pool)
        if mode not in self._profiles:
            self._profiles[mode] = policy(mode, self._plugin_args)
        return self._profiles[mode]

    @property
    def learned_submissions(self) -> int:
        """How many submissions the learned workload mix has counted since the start."""
        return self._recent.seen

    def learn(self, workloads: list[StoredWorkload]) -> None:
        """Count new submissions' requests; relearn the target workload when enough are new, and start
        new policies only when it changed (a new policy scores every node again). A batch the ledger
        abandoned is recorded again in two steps: its submissions, counted by the previous call, are
        not counted twice."""
        counted = self._last_learned
        self._last_learned = {stored.allocation_id for stored in workloads}
        for stored in workloads:
            if stored.allocation_id in counted:
                continue
            submission = stored.submission
            try:
                self._recent.add(
                    placement_request(
                        f"{submission.workload.namespace}/{submission.workload.name}",
                        submission.request,
                        tolerations=submission.tolerations,
                        node_selector=submission.node_selector,
                    )
                )
            except PlacementRequestError:
                continue
        if self._recent.due():
            learned = self._recent.learn()
            if same_target(self._plugin_args, learned):
                self._learned = None
                return
            self._learned = learned
            if self._relearning is None or self._relearning.done():
                self._relearning = asyncio.create_task(self.start_learned(), name=f"{self.name}-relearn")

    async def relearned(self) -> None:
        """Wait until the policies of the last target learned have started (they start in the background
        a moment after the submissions that changed the target)."""
        while self._relearning is not None and not self._relearning.done():
            await asyncio.shield(self._relearning)

    async def start_learned(self) -> None:
        """Start the policies of the last target learned, once what they need is computed in a worker
        thread (the default policy's card values take about 0.1 s of CPU, which would stall placing)."""
        while (learned := self._learned) is not None:
            try:
                await asyncio.to_thread(prepare_policy_inputs, learned)
            except Exception:  # the policies then compute it themselves when first used
                log.exception("preparing the new policies failed", extra={"event": "scheduler.relearn"})
            if self._learned is learned:
                self._learned = None
                self._plugin_args = learned
                self._profiles.clear()
