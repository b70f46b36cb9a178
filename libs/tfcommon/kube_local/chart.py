"""Generate the Helm chart's copied parts from their one source, so that the chart never drifts.

`charts/tfpool` templates its workloads itself, but what it shares with the kustomize base and the
compose files is copied here from where it is kept, never edited by hand:

- `crds/`: the CustomResourceDefinitions of `k8s/base/crds`;
- `files/rbac.yaml`: every ClusterRole's and Role's rules of the rendered `k8s/base`, by component
  (`scheduler` for `tfpool-scheduler`), which the chart's RBAC templates read;
- `files/config.yaml` (`k8s/base/config`), `files/nats.conf` and `files/nats-cluster.conf`
  (`deploy/nats`), `files/postgres/` (`deploy/postgres`) and `files/monitoring/` (`k8s/base/monitoring`).

`python -m tfcommon.kube_local.chart` writes them; `--check` changes nothing and exits 1 naming each
stale file (the chart's tests run it, so an edit of `k8s/base` that is not regenerated fails).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parents[3]
CHART_DIR = REPO_ROOT / "charts" / "tfpool"
KUBECTL = Path(sys.executable).parent / "kubectl"
NAME_PREFIX = "tfpool-"
REGENERATE = "python -m tfcommon.kube_local.chart"

COPIED: Mapping[str, str] = {
    "files/config.yaml": "k8s/base/config/config.yaml",
    "files/nats.conf": "deploy/nats/nats.conf",
    "files/nats-cluster.conf": "deploy/nats/cluster.conf",
    "files/postgres/init-roles.sh": "deploy/postgres/init-roles.sh",
    "files/postgres/roles.sql": "deploy/postgres/roles.sql",
    "files/monitoring/prometheusrule.yaml": "k8s/base/monitoring/prometheusrule.yaml",
    "files/monitoring/grafana-dashboard.json": "k8s/base/monitoring/grafana-dashboard.json",
}
"""Chart path: source path, both relative (to the chart and the repository), copied byte for byte."""


class ChartSourceError(RuntimeError):
    """The kustomize base could not be rendered, or holds a role the chart cannot name."""


def _yaml_header(source: str) -> str:
    return f"# Generated from {source} by `{REGENERATE}`: edit the source, then regenerate.\n"


def rendered_base(repo_root: Path = REPO_ROOT) -> list[dict[str, Any]]:
    """`kubectl kustomize k8s/base`, parsed into objects."""
    result = subprocess.run(
        [str(KUBECTL), "kustomize", str(repo_root / "k8s" / "base")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if result.returncode != 0:
        raise ChartSourceError(f"kubectl kustomize k8s/base failed: {result.stderr.strip()}")
    return [document for document in yaml.safe_load_all(result.stdout) if document]


def rbac_rules(objects: list[dict[str, Any]]) -> dict[str, dict[str, list[Any]]]:
    """Each component's ClusterRole (`clusterRole`) and Role (`role`) rules, by component name."""
    rules: dict[str, dict[str, list[Any]]] = {}
    for document in objects:
        kind = document.get("kind")
        if kind not in {"ClusterRole", "Role"}:
            continue
        name = str(document["metadata"]["name"])
        if not name.startswith(NAME_PREFIX):
            raise ChartSourceError(
                f"{kind} {name} in k8s/base: chart roles are named {NAME_PREFIX}<component>"
            )
        key = "clusterRole" if kind == "ClusterRole" else "role"
        rules.setdefault(name.removeprefix(NAME_PREFIX), {})[key] = document.get("rules") or []
    return dict(sorted(rules.items()))


def expected_files(repo_root: Path = REPO_ROOT) -> dict[str, bytes]:
    """Every generated chart file (path relative to the chart) with the content it must have."""
    files: dict[str, bytes] = {}
    for crd in sorted((repo_root / "k8s" / "base" / "crds").glob("*.yaml")):
        source = crd.relative_to(repo_root).as_posix()
        files[f"crds/{crd.name}"] = _yaml_header(source).encode() + crd.read_bytes()
    rbac = yaml.safe_dump(rbac_rules(rendered_base(repo_root)), sort_keys=False)
    files["files/rbac.yaml"] = (_yaml_header("the ClusterRoles and Roles of k8s/base") + rbac).encode()
    for target, source in COPIED.items():
        files[target] = (repo_root / source).read_bytes()
    return files


def stale_files(chart_dir: Path = CHART_DIR, repo_root: Path = REPO_ROOT) -> list[str]:
    """Generated files that are missing or differ, and CRDs in `crds/` with no source: empty when current."""
    expected = expected_files(repo_root)
    stale = [path for path, content in expected.items() if _read(chart_dir / path) != content]
    stale += [
        f"crds/{extra.name} (no k8s/base/crds source)"
        for extra in sorted((chart_dir / "crds").glob("*"))
        if f"crds/{extra.name}" not in expected
    ]
    return stale


def _read(path: Path) -> bytes | None:
    return path.read_bytes() if path.is_file() else None


def write_files(chart_dir: Path = CHART_DIR, repo_root: Path = REPO_ROOT) -> list[str]:
    """Write every generated file, remove CRDs with no source; returns what changed."""
    changed = stale_files(chart_dir, repo_root)
    expected = expected_files(repo_root)
    for extra in (chart_dir / "crds").glob("*"):
        if f"crds/{extra.name}" not in expected:
            extra.unlink()
    for path, content in expected.items():
        target = chart_dir / path
        target.parent.mkdir(parents=True, exist_ok=True)
        if _read(target) != content:
            target.write_bytes(content)
    return changed


def main(argv: list[str] | None = None) -> int:
    """Write the generated chart files, or with `--check` report the stale ones (exit 1)."""
    parser = argparse.ArgumentParser(prog=REGENERATE, description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a file is stale")
    args = parser.parse_args(argv)
    try:
        changed = stale_files() if args.check else write_files()
    except ChartSourceError as error:
        sys.stderr.write(f"{REGENERATE}: {error}\n")
        return 1
    if args.check and changed:
        sys.stderr.write(
            f"charts/tfpool is stale ({', '.join(changed)}): run `{REGENERATE}` and commit the result\n"
        )
        return 1
    for path in changed:
        sys.stdout.write(f"wrote charts/tfpool/{path}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
