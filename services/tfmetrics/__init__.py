"""Metrics: OpenTelemetry series, billing from the ledger, fragmentation KPIs and the dashboard."""
