"""Composition root of the metrics service (serves metrics, billing, fragmentation KPIs and the dashboard).

Only wiring lives here: `compose` plugs routers, handlers, timers and tasks into the shared runtime
(`tfcommon.runtime`); decisions live in `tfmetrics.core`. Nothing is built at import time.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from decimal import Decimal
from functools import partial

from tfcommon import subjects
from tfcommon.config_source import ConfigSource
from tfcommon.ledger.recommendations import RecommendationStore
from tfcommon.pool_source import wire_gpu_pools
from tfcommon.runtime import Components, ServiceContext, ServiceSpec, Timer, run_service
from tfcommon.settings import MetricsSettings
from tfcommon.telemetry import setup_telemetry

from tfmetrics.billing_api import bill_from_ledger, bill_to_json, build_billing_router, utc_now
from tfmetrics.core.billing import Bill
from tfmetrics.core.pricing import pricing_problems
from tfmetrics.core.recommendations import RecommendationPolicy
from tfmetrics.core.series import Sample, snapshot_samples
from tfmetrics.dashboard import DashboardSources, build_dashboard_router, campaigns_since, latest_campaigns
from tfmetrics.exporter import build_metrics_router, series_board
from tfmetrics.handlers import count_events_handler, record_usage_handler
from tfmetrics.live import Clock, LiveView
from tfmetrics.pool_history import PoolHistory
from tfmetrics.prices import wire_prices
from tfmetrics.recommender import Recommender, UsageWindow, build_recommendations_router
from tfmetrics.workload_reads import pending_workloads

SERVICE = "metrics"

_log = logging.getLogger("tfmetrics.app")


async def compose(context: ServiceContext[MetricsSettings], clock: Clock = utc_now) -> Components:
    settings = context.settings
    setup_telemetry(context.name, settings.otlp_endpoint)
    config, pool_tasks = wire_gpu_pools(
        ConfigSource(settings.config_file),
        service=SERVICE,
        stop=context.stopping,
        checks=[pricing_problems],
        report=False,  # its account only reads
        on_close=context.cleanup.callback,
    )
    prices, price_tasks = wire_prices(settings.gpu_cost_per_hour, context.stopping, context.cleanup.callback)
    view = LiveView(context.ledger, clock=clock)
    history = PoolHistory(context.database, clock, timedelta(seconds=settings.history_interval_s))
    board = series_board()
    recommendations = RecommendationStore(context.database)
    recommender = Recommender(
        store=recommendations,
        usage=UsageWindow(timedelta(seconds=settings.recommendation_window_s)),
        policy=RecommendationPolicy(min_samples=settings.recommendation_min_samples),
        snapshot=lambda: view.snapshot,
        clock=utc_now,
    )
    memo: dict[str, object] = {}

    def current_samples() -> list[Sample]:
        if view.snapshot is None:
            return []
        if memo.get("snapshot") is not view.snapshot:
            memo["snapshot"] = view.snapshot
            memo["samples"] = snapshot_samples(view.snapshot)
        samples = memo["samples"]
        assert isinstance(samples, list)
        return samples

    board.source = current_samples

    def detach() -> None:
        if board.source is current_samples:
            board.source = None

    context.cleanup.callback(detach)

    async def refresh_ledger() -> None:
        try:
            await view.refresh()
        except Exception as error:
            view.last_error = str(error).splitlines()[0] if str(error) else type(error).__name__
            _log.warning(
                "ledger read failed; keeping the last snapshot",
                extra={"event": "metrics.refresh_failed", "outcome": "error", "reason": view.last_error},
            )

    loaded = False

    async def sample_history() -> None:
        nonlocal loaded
        try:
            if not loaded:
                await history.load()
                loaded = True
            await history.record(view.snapshot)
        except Exception as error:
            _log.warning(
                "pool history not stored; retrying next refresh",
                extra={"event": "metrics.history_failed", "outcome": "error", "reason": str(error)},
            )

    async def recommend() -> None:
        try:
            await recommender.run_once()
        except Exception as error:
            _log.warning(
                "recommendations not stored; retrying next interval",
                extra={"event": "metrics.recommend_failed", "outcome": "error", "reason": str(error)},
            )

    async def bill_for_window(window: timedelta, quantum: Decimal) -> Bill:
        end = utc_now()
        return await bill_from_ledger(
            context.ledger,
            config.current(),
            prices,
            start=end - window,
            end=end,
            group_by="namespace",
            quantum=quantum,
        )

    return Components(
        routers=[
            build_metrics_router(),
            build_billing_router(context.ledger, config.current, prices),
            build_dashboard_router(
                view,
                DashboardSources(
                    bill_for_window=bill_for_window,
                    bill_to_json=bill_to_json,
                    history=history,
                    campaigns=lambda: latest_campaigns(context.ledger),
                    campaigns_since=lambda start: campaigns_since(context.ledger, start),
                    pending=lambda: pending_workloads(context.ledger),
                ),
            ),
            build_recommendations_router(recommendations, config.current),
        ],
        handlers={
            subjects.METRICS_RECORD_USAGE: record_usage_handler(view, recommender.usage),
            subjects.METRICS_COUNT_EVENTS: count_events_handler(board),
        },
        timers={
            "refresh-ledger": Timer(settings.refresh_interval_s, refresh_ledger, at_start=True),
            "sample-history": Timer(settings.refresh_interval_s, sample_history, at_start=True),
            "recommend": Timer(settings.recommendation_interval_s, recommend),
        },
        tasks={**pool_tasks, **price_tasks},
    )


def build(settings: MetricsSettings, clock: Clock = utc_now) -> ServiceSpec[MetricsSettings]:
    """The metrics service as the runtime runs it; `clock` times the snapshots and the pool history."""
    return ServiceSpec(
        name=SERVICE, settings=settings, port=settings.port, compose=partial(compose, clock=clock)
    )


def main() -> int:
    return run_service(build(MetricsSettings()))
