"""The alerting rules (dashboards/alerts.yml): valid for Prometheus, tested by promtool on
their own series (dashboards/alerts_test.yml), using only metrics quire exports, packaged
and loaded by the shipped Prometheus configuration."""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

from tests.dashboards.test_grafana import known_series, quire_registry

REPO = Path(__file__).resolve().parents[2]
ALERTS = REPO / "dashboards" / "alerts.yml"
ALERTS_TEST = REPO / "dashboards" / "alerts_test.yml"
METRIC = re.compile(r"\bquire_[a-z0-9_]+\b")

REQUIRED = {"QuirePersistBacklogOld", "QuirePersistRefused", "QuireJobWatermarkBehind",
            "QuireJobRunGaveUp", "QuireRouteIncomplete", "QuireCertificateExpiresSoon"}


def promtool() -> str:
    path = shutil.which("promtool")
    assert path, "promtool not found: install Debian's `prometheus` package (Makefile SYSTEM_PACKAGES)"
    return path


def rules() -> list[dict]:
    return [r for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]]


def test_promtool_check_rules() -> None:
    out = subprocess.run([promtool(), "check", "rules", str(ALERTS)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(rules())} rules found" in out.stdout


def test_promtool_test_rules() -> None:
    out = subprocess.run([promtool(), "test", "rules", str(ALERTS_TEST)], capture_output=True,
                         text=True, timeout=120, cwd=ALERTS_TEST.parent)
    assert out.returncode == 0, out.stdout + out.stderr


def test_every_alert_is_tested_firing() -> None:
    tests = yaml.safe_load(ALERTS_TEST.read_text())["tests"]
    fired = {c["alertname"] for t in tests for c in t["alert_rule_test"] if c.get("exp_alerts")}
    silent = {c["alertname"] for t in tests for c in t["alert_rule_test"] if not c.get("exp_alerts")}
    names = {r["alert"] for r in rules()}
    assert REQUIRED <= names
    assert names <= fired, f"alerts never shown firing: {sorted(names - fired)}"
    assert (names - {"QuireCertificateExpiresSoon"}) <= silent, \
        f"alerts never shown silent: {sorted(names - silent)}"


def test_alerts_use_exported_metrics_and_say_what_to_do() -> None:
    known = known_series() | set(quire_registry())
    for r in rules():
        used = set(METRIC.findall(r["expr"]))
        assert used, r["alert"]
        assert used <= known, f"{r['alert']} uses series nobody exports: {sorted(used - known)}"
        assert r["labels"]["severity"] in {"warning", "critical"}, r["alert"]
        assert r["annotations"]["summary"] and r["annotations"]["runbook"], r["alert"]


def test_alerts_shipped_and_loaded() -> None:
    prometheus = yaml.safe_load((REPO / "dashboards" / "prometheus.yml").read_text())
    assert "alerts.yml" in prometheus["rule_files"]
    data = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "alerts.yml" in data["tool"]["setuptools"]["package-data"]["dashboards"]
    compose = yaml.safe_load((REPO / "compose" / "docker-compose.yml").read_text())
    assert any(v.startswith("../dashboards/alerts.yml:/etc/prometheus/alerts.yml")
               for v in compose["services"]["prometheus"]["volumes"])


@pytest.mark.parametrize("path", [ALERTS, ALERTS_TEST])
def test_rule_files_parse(path: Path) -> None:
    assert yaml.safe_load(path.read_text())
