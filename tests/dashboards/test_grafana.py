"""The Grafana dashboard, its provisioning and the Prometheus config refer only to things
that exist: metric names in the code's registry (or Flower's), the provisioned datasource,
and scrape targets that are services of compose/docker-compose.yml."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "dashboards" / "grafana" / "quire.json"
PROVISIONING = REPO / "dashboards" / "grafana" / "provisioning"
PROMETHEUS = REPO / "dashboards" / "prometheus.yml"
COMPOSE = REPO / "compose" / "docker-compose.yml"

METRIC = re.compile(r"\b(?:quire|flower)_[a-z0-9_]+\b")

# Flower's /metrics (flower docs/prometheus-integration.rst; defined in flower/events.py).
FLOWER_METRICS = {
    "flower_events_total": "counter",
    "flower_task_runtime_seconds": "histogram",
    "flower_task_prefetch_time_seconds": "gauge",
    "flower_worker_prefetched_tasks": "gauge",
    "flower_worker_online": "gauge",
    "flower_worker_number_of_currently_executing_tasks": "gauge",
}


def sample_names(name: str, kind: str) -> set[str]:
    """The series names Prometheus stores for one metric family."""
    if kind == "counter":
        base = name.removesuffix("_total")
        return {base + "_total", base + "_created"}
    if kind == "histogram":
        return {name + "_bucket", name + "_sum", name + "_count", name + "_created"}
    if kind == "summary":
        return {name, name + "_sum", name + "_count", name + "_created"}
    return {name}


def quire_registry() -> dict[str, str]:
    """Every quire_ family registered by the coordinator's, workers' and consumers' metric modules."""
    from prometheus_client import REGISTRY

    import coordinator.index_watch  # noqa: F401 - registers quire_index_age_seconds, …
    import coordinator.metrics  # noqa: F401
    import consumers.metrics  # noqa: F401 - registers quire_shard_*
    import coordinator.backlog  # noqa: F401 - registers quire_persist_backlog_*, quire_route_*
    import coordinator.persister  # noqa: F401 - registers quire_persist_lag_*, …
    import workers.jobs_metrics  # noqa: F401 - registers quire_job_*, the watermark gauge
    import workers.metrics  # noqa: F401
    import workers.scrub  # noqa: F401 - registers quire_scrub_*
    from protocol.logs import error_counter

    error_counter()  # quire_log_errors_total: every server process counts its errors

    return {m.name: m.type for m in REGISTRY.collect() if m.name.startswith("quire_")}


def known_series() -> set[str]:
    families = {**quire_registry(), **FLOWER_METRICS}
    return set().union(*(sample_names(n, k) for n, k in families.items()))


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def panels() -> list[dict[str, Any]]:
    return [p for p in dashboard()["panels"] if p["type"] != "row"]


def test_flower_metric_set_matches_installed_flower() -> None:
    spec = importlib.util.find_spec("flower.events")
    if spec is None or spec.origin is None:
        pytest.skip("flower not installed")
    source = Path(spec.origin).read_text()
    defined = set(re.findall(r"['\"](flower_[a-z_]+)['\"]", source))
    assert defined == set(FLOWER_METRICS)


def exprs() -> list[str]:
    out = [t["expr"] for p in panels() for t in p["targets"]]
    for v in dashboard()["templating"]["list"]:
        if isinstance(v.get("query"), dict):
            out.append(v["query"]["query"])
    return out


def test_every_metric_in_the_dashboard_exists() -> None:
    in_queries = set(METRIC.findall("\n".join(exprs())))
    assert in_queries, "no metric referenced"
    unknown = in_queries - known_series()
    assert not unknown, f"queries use series nobody exports: {sorted(unknown)}"
    # descriptions may name a histogram by its family name
    families = set(quire_registry()) | set(FLOWER_METRICS)
    unknown = set(METRIC.findall(DASHBOARD.read_text())) - known_series() - families
    assert not unknown, f"dashboard mentions metrics nobody exports: {sorted(unknown)}"


def test_dashboard_covers_every_quire_metric() -> None:
    referenced = set(METRIC.findall(DASHBOARD.read_text()))
    for name, kind in quire_registry().items():
        assert sample_names(name, kind) & referenced, f"{name} ({kind}) has no panel"
    for name, kind in FLOWER_METRICS.items():
        assert sample_names(name, kind) & referenced, f"{name} has no panel"


def test_required_panels_present() -> None:
    titles = {p["title"] for p in panels()}
    for title in ("Append throughput", "Append latency", "Appends in flight", "Pipeline rebuilds",
                  "Spool bytes", "Persistence lag (bytes)", "Persistence lag (seconds)", "Index age",
                  "Task failures", "Workers online", "Task events", "Task runtime p95"):
        assert title in titles, title


def test_dashboard_structure() -> None:
    d = dashboard()
    assert d["uid"] == "quire-overview" and d["title"] == "quire"
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    occupied: set[tuple[int, int]] = set()
    for p in d["panels"]:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24, p["title"]
        cells = {(g["x"] + dx, g["y"] + dy) for dx in range(g["w"]) for dy in range(g["h"])}
        assert not cells & occupied, f"{p['title']} overlaps another panel"
        occupied |= cells
    for p in panels():
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p["targets"] and all(t["expr"].strip() for t in p["targets"]), p["title"]
        assert p["description"], p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs))
        for t in p["targets"]:
            assert t["expr"].count("(") == t["expr"].count(")"), t["expr"]
            assert t["expr"].count("{") == t["expr"].count("}"), t["expr"]
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"


def test_no_unbounded_label_in_legends_except_topk() -> None:
    """Journal names are unbounded: a per-journal series must be capped with topk."""
    for p in panels():
        for t in p["targets"]:
            if "by (journal)" in t["expr"]:
                assert t["expr"].startswith("topk("), t["expr"]


def test_provisioning_files() -> None:
    ds = yaml.safe_load((PROVISIONING / "datasources" / "quire.yaml").read_text())
    assert ds["apiVersion"] == 1
    (source,) = ds["datasources"]
    assert source["type"] == "prometheus" and source["isDefault"] is True
    assert dashboard()["templating"]["list"][0]["current"]["value"] == source["uid"]
    prov = yaml.safe_load((PROVISIONING / "dashboards" / "quire.yaml").read_text())
    assert prov["apiVersion"] == 1
    (provider,) = prov["providers"]
    assert provider["type"] == "file" and provider["options"]["foldersFromFilesStructure"] is True
    # compose mounts the dashboard under the provider's path and the provisioning dir in place
    grafana = yaml.safe_load(COMPOSE.read_text())["services"]["grafana"]
    mounts = dict(v.rsplit(":", 1)[0].split(":", 1) for v in grafana["volumes"] if v.startswith(".."))
    assert mounts["../dashboards/grafana/provisioning"] == "/etc/grafana/provisioning"
    assert mounts["../dashboards/grafana/quire.json"].startswith(provider["options"]["path"] + "/")
    host = source["url"].split("//", 1)[1].split(":")[0]
    assert host in yaml.safe_load(COMPOSE.read_text())["services"]


def test_prometheus_scrapes_coordinators_workers_and_flower() -> None:
    config = yaml.safe_load(PROMETHEUS.read_text())
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    assert {"quire-coordinator", "quire-worker", "flower"} <= set(jobs)
    targets = {name: [t for sc in job["static_configs"] for t in sc["targets"]]
               for name, job in jobs.items()}
    coordinators = {n for n, s in services.items() if s.get("command", [None, None])[:2] == ["quire", "coordinator"]}
    assert {t.split(":")[0] for t in targets["quire-coordinator"]} == coordinators
    for t in targets["quire-coordinator"]:
        # Scraped directly: the coordinator binds its metrics server beyond loopback.
        host, port = t.split(":")
        cmd = services[host]["command"]
        assert cmd[cmd.index("--metrics-port") + 1] == port
        assert cmd[cmd.index("--metrics-addr") + 1] == "0.0.0.0"
    workers = {n for n, s in services.items() if s.get("command", [None] * 4)[3:4] == ["worker"]}
    assert {t.split(":")[0] for t in targets["quire-worker"]} == workers
    for t in targets["quire-worker"]:
        host, port = t.split(":")
        assert services[host]["environment"]["QUIRE_WORKER_METRICS_PORT"] == port
    (flower,) = targets["flower"]
    assert jobs["flower"]["metrics_path"] == "/metrics"
    assert f"--port={flower.split(':')[1]}" in services[flower.split(":")[0]]["command"]
