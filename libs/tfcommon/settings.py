"""Settings read from the environment (prefix `TF_`), one class per service.

Every service composes the shared `NatsSettings` and `DatabaseSettings`. Nothing here is built at
import time: callers construct the class they need (`SchedulerSettings()`), so tests pass their own.
Every field is listed in the README's configuration table.
"""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class NatsSettings(BaseSettings):
    """Where the bus is. Unset `TF_NATS_URL` means: start an embedded nats-server."""

    model_config = SettingsConfigDict(env_prefix="TF_NATS_", extra="ignore")

    url: str | None = Field(
        default=None,
        description="NATS URL, e.g. nats://127.0.0.1:4222; several servers of one cluster separated by "
        "commas (each is tried, and reconnection moves to another)",
    )
    user: str | None = Field(default=None, description="NATS user name, when the server requires one")
    password: SecretStr | None = Field(default=None, description="NATS password")
    password_file: Path | None = Field(
        default=None,
        description="file holding the NATS password, read again at every (re)connection: a node agent's "
        "projected service-account token, which the kubelet rotates (instead of TF_NATS_PASSWORD)",
    )
    stream_replicas: int = Field(
        default=1,
        ge=1,
        le=5,
        description="servers that keep a copy of each stream a service creates (3 on a 3-server NATS "
        "cluster; the Helm chart sets 3); a service's start-up never lowers a stream's replicas",
    )
    tls_ca_file: Path | None = Field(
        default=None,
        description="PEM CA that signed the NATS server's certificate; set, the bus connects only over TLS "
        "and checks the server's name against TF_NATS_URL's host",
    )
    tls_cert_file: Path | None = Field(
        default=None, description="PEM client certificate, for a NATS server that verifies clients"
    )
    tls_key_file: Path | None = Field(default=None, description="PEM private key of TF_NATS_TLS_CERT_FILE")

    def password_source(self) -> str | Callable[[], str] | None:
        """What the bus sends as the password: TF_NATS_PASSWORD, or a reader of TF_NATS_PASSWORD_FILE
        called at each connection (so a rotated token is picked up on reconnect)."""
        if self.password_file is not None:
            path = self.password_file
            return lambda: path.read_text(encoding="utf-8").strip()
        return self.password.get_secret_value() if self.password is not None else None

    @model_validator(mode="after")
    def _client_certificate_has_its_key(self) -> NatsSettings:
        if self.password is not None and self.password_file is not None:
            raise ValueError("TF_NATS_PASSWORD and TF_NATS_PASSWORD_FILE are both set: keep one")
        if self.password_file is not None and not self.password_file.is_file():
            raise ValueError(
                f"TF_NATS_PASSWORD_FILE={self.password_file}: no such file; mount the node agent's "
                "projected token there or set TF_NATS_PASSWORD"
            )
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError(
                "TF_NATS_TLS_CERT_FILE and TF_NATS_TLS_KEY_FILE go together: set both (a client "
                "certificate and its private key) or neither"
            )
        return self


class DatabaseSettings(BaseSettings):
    """Where the ledger is. Unset `TF_DATABASE_URL` means: start an embedded Postgres."""

    model_config = SettingsConfigDict(env_prefix="TF_DATABASE_", extra="ignore")

    url: str | None = Field(
        default=None,
        description="SQLAlchemy URL, e.g. postgresql+psycopg://postgres@127.0.0.1:5432/tfpool (every "
        "service but the node agent, which holds no database credential)",
    )
    pool_size: int = Field(default=10, ge=1, description="connections kept per service process")


class ServiceSettings(BaseSettings):
    """What every service shares: bus, ledger, configuration file, log level, bind address."""

    model_config = SettingsConfigDict(env_prefix="TF_", extra="ignore", env_nested_delimiter="__")

    nats: NatsSettings = Field(default_factory=NatsSettings)
    database: DatabaseSettings = Field(default_factory=DatabaseSettings)
    config_file: Path | None = Field(
        default=None, description="the YAML configuration file every service reads (TF_CONFIG_FILE)"
    )
    log_level: str = Field(default="INFO", description="DEBUG, INFO, WARNING or ERROR")
    bind_host: str = Field(default="0.0.0.0", description="address the HTTP server binds")
    api_token: SecretStr | None = Field(
        default=None, description="bearer token required by mutating HTTP endpoints (TF_API_TOKEN)"
    )
    otlp_endpoint: str | None = Field(
        default=None, description="OTLP endpoint for traces and metrics; unset exports nothing"
    )


class WebhookSettings(ServiceSettings):
    port: int = Field(default=9443, description="HTTPS port of the admission webhook (TF_PORT)")
    tls_cert_file: Path | None = Field(default=None, description="PEM certificate; self-signed if unset")
    tls_key_file: Path | None = Field(default=None, description="PEM private key; self-signed if unset")


class SchedulerKubernetesSettings(BaseSettings):
    """The scheduler's Kubernetes mode (`TF_SCHEDULER_MODE=kubernetes`): where the API server is and how
    often the custom-resource status is written. `local` (the default) takes workloads from the API only."""

    model_config = SettingsConfigDict(env_prefix="TF_SCHEDULER_", extra="ignore")

    mode: Literal["local", "kubernetes"] = Field(
        default="local", description="kubernetes: watch pods of our schedulerName, bind them, write CR status"
    )
    kubeconfig: Path | None = Field(
        default=None, description="kubeconfig file outside a cluster; in a pod its service account is used"
    )
    kube_context: str | None = Field(default=None, description="kubeconfig context; its current one if unset")
    scheduler_name: str = Field(
        default="tensor-fusion-scheduler", min_length=1, description="spec.schedulerName of the pods to place"
    )
    bind_concurrency: int = Field(default=64, ge=1, description="pods placed and bound at the same time")
    status_debounce_s: float = Field(
        default=0.2, gt=0, le=1.0, description="wait after a change before writing GPU/GPUNode/GPUPool status"
    )
    status_poll_interval_s: float = Field(
        default=0.5, gt=0, le=1.0, description="ledger check for changes made by other processes"
    )
    pending_retry_interval_s: float = Field(
        default=10.0,
        gt=0,
        description="waiting pods are tried again this often, and whenever capacity frees",
    )
    leader_election: bool = Field(
        default=True, description="kubernetes mode: only the holder of the Lease watches, places and binds"
    )
    lease_name: str = Field(
        default="tfpool-scheduler", min_length=1, description="the coordination.k8s.io Lease of the election"
    )
    lease_namespace: str | None = Field(
        default=None, description="the Lease's namespace; unset: POD_NAMESPACE, else the service account's"
    )
    lease_duration_s: int = Field(
        default=15, ge=1, description="a leader that stops renewing is replaced after this many seconds"
    )
    renew_deadline_s: float = Field(
        default=10.0, gt=0, description="a leader that cannot renew for this long stops watching and binding"
    )
    retry_period_s: float = Field(
        default=2.0, gt=0, description="how often the leader renews and the other replicas try to acquire"
    )

    @model_validator(mode="after")
    def _election_timings_fit(self) -> SchedulerKubernetesSettings:
        if not self.retry_period_s < self.renew_deadline_s < self.lease_duration_s:
            raise ValueError(
                "TF_SCHEDULER_RETRY_PERIOD_S < TF_SCHEDULER_RENEW_DEADLINE_S < TF_SCHEDULER_LEASE_DURATION_S "
                f"is required, got {self.retry_period_s} < {self.renew_deadline_s} < "
                f"{self.lease_duration_s}: shorten the renew deadline or lengthen the lease duration"
            )
        return self


class SchedulerSettings(ServiceSettings):
    port: int = Field(default=8080, description="HTTP port of the scheduler API (TF_PORT)")
    kubernetes: SchedulerKubernetesSettings = Field(
        default_factory=SchedulerKubernetesSettings, description="Kubernetes mode (TF_SCHEDULER_MODE, ...)"
    )


class DefragSettings(ServiceSettings):
    port: int = Field(default=8070, description="HTTP port of the defrag planner API (TF_PORT)")
    tick_interval_s: float = Field(
        default=30.0, gt=0, description="seconds between checks for due campaigns and compaction"
    )
    replacement_timeout_s: float = Field(
        default=300.0, gt=0, description="seconds to wait for an evicted pod's replacement to be placed"
    )
    defrag_scheduler_url: str = Field(
        default="http://127.0.0.1:8080",
        description="local mode: the scheduler API the planner lists workloads from and evicts through",
    )
    defrag_pdb_file: Path | None = Field(
        default=None,
        description="local mode: YAML file of PodDisruptionBudget manifests matched against workload labels",
    )


class GpuModelOverride(BaseModel):
    """A GPU model the operator adds or corrects: short name, dense FP16 tensor TFLOPS x 1000, NVML names."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1)
    fp16_tflops_milli: int = Field(ge=1)
    vram_bytes: int = Field(default=0, ge=0)
    nvml_names: tuple[str, ...] = ()
    source: str = "operator configuration (TF_GPU_MODELS)"


class AgentSettings(ServiceSettings):
    port: int = Field(default=8001, description="HTTP port of the node agent's hypervisor API (TF_PORT)")
    node_name: str | None = Field(default=None, description="node this agent serves; host name if unset")
    fake_gpus: str | None = Field(
        default=None, description="simulate GPUs instead of NVML, e.g. H100:8,A100-80G:4"
    )
    pool: str = Field(default="default", description="GPU pool this node's GPUs belong to (TF_POOL)")
    heartbeat_interval_s: float = Field(default=5.0, gt=0, description="seconds between node heartbeats")
    sample_interval_s: float = Field(default=5.0, gt=0, description="seconds between GPU usage reports")
    discovery_interval_s: float = Field(default=300.0, gt=0, description="seconds between GPU rediscoveries")
    fallback_tflops_milli: int = Field(
        default=50_000, ge=1, description="capacity (milli-TFLOPS) of a GPU model not in the model table"
    )
    device_plugin_dir: Path | None = Field(
        default=None,
        description="kubelet device-plugin folder (/var/lib/kubelet/device-plugins); unset: no plugin",
    )
    limiter_library: str | None = Field(
        default=None, description="host path of a GPU limiter library (e.g. HAMi-core libvgpu.so) to preload"
    )
    gpu_models: tuple[GpuModelOverride, ...] = Field(
        default=(),
        description='extra or corrected GPU models as JSON, e.g. [{"name": "X9", "fp16_tflops_milli": '
        '500000, "nvml_names": ["NVIDIA X9"]}] (TF_GPU_MODELS)',
    )
    agent_kubernetes: bool = Field(
        default=False,
        description="write this node's GPUNode and GPU objects and their status to the Kubernetes API",
    )
    agent_kubeconfig: Path | None = Field(
        default=None, description="kubeconfig file outside a cluster; in a pod its service account is used"
    )
    agent_state_dir: Path = Field(
        default=Path("~/.local/state/tfpool/agent"),
        description="where the agent journals its running `tfctl run` workers, so that a restarted agent "
        "stops and releases what a crashed one left (`tfctl up` sets STATE_DIR/agent)",
    )


class MetricsSettings(ServiceSettings):
    port: int = Field(default=8090, description="HTTP port of metrics, billing and the dashboard (TF_PORT)")
    gpu_cost_per_hour: dict[str, Decimal] = Field(
        default_factory=dict,
        description="hourly price of a whole dedicated GPU per model, for billing savings, as JSON, e.g. "
        '{"H100": "2.49", "A100-80G": "1.60"} (TF_GPU_COST_PER_HOUR)',
    )
    refresh_interval_s: float = Field(
        default=5.0, gt=0, description="seconds between ledger reads for the metrics and the dashboard"
    )
    history_interval_s: float = Field(
        default=30.0,
        gt=0,
        description="seconds between the pool samples the dashboard charts, kept 24 h in the ledger "
        "(TF_HISTORY_INTERVAL_S)",
    )
    recommendation_window_s: float = Field(
        default=86_400.0,
        gt=0,
        description="seconds of usage samples a recommendation looks at (TF_RECOMMENDATION_WINDOW_S)",
    )
    recommendation_min_samples: int = Field(
        default=30,
        ge=1,
        description="fewer samples than this keep a workload's values (TF_RECOMMENDATION_MIN_SAMPLES)",
    )
    recommendation_interval_s: float = Field(
        default=60.0,
        gt=0,
        description="seconds between storing new recommendations (TF_RECOMMENDATION_INTERVAL_S)",
    )
