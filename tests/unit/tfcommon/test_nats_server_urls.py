"""`server_urls`: `TF_NATS_URL` names one server, or a cluster's servers separated by commas."""

from __future__ import annotations

from tfcommon.bus import server_urls


def test_one_url_is_one_server() -> None:
    assert server_urls("nats://127.0.0.1:4222") == ["nats://127.0.0.1:4222"]


def test_a_cluster_is_its_servers_in_order_without_blanks() -> None:
    urls = "nats://10.0.0.1:4222, nats://10.0.0.1:4223,nats://10.0.0.1:4224,"
    assert server_urls(urls) == ["nats://10.0.0.1:4222", "nats://10.0.0.1:4223", "nats://10.0.0.1:4224"]
