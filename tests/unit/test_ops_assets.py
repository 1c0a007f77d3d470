"""The operator assets (ops/): alerting rules and the Grafana dashboard.

Every ``kirim_*`` name they use must be one that kirim's registry really exports,
read at test time from a fresh ``Metrics``: a renamed metric breaks this test, not
an operator's alert in the middle of the night.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from kirim.observe.metrics import Metrics

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "ops" / "prometheus" / "alerts.yml"
DASHBOARD = ROOT / "ops" / "grafana" / "kirim.json"
NAME = re.compile(r"\bkirim_[A-Za-z0-9_:]*")
DURATION = re.compile(r"^(\d+(ms|s|m|h|d|w|y))+$")
SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "gauge": ("",),
}


def exported() -> set[str]:
    """Every sample name kirim's registry can expose (labelled families included)."""
    registry = CollectorRegistry()
    Metrics(registry)
    names: set[str] = set()
    for family in registry.collect():
        # A labelled family has no samples until a child exists: derive them from its type.
        names.update(family.name + suffix for suffix in SUFFIXES[family.type])
        names.update(sample.name for sample in family.samples)
    return names


def rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(ALERTS.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def targets() -> list[dict[str, Any]]:
    doc = json.loads(DASHBOARD.read_text())
    return [t for p in doc["panels"] if p["type"] != "row" for t in p["targets"]]


def test_exported_names_come_from_the_registry() -> None:
    names = exported()
    assert "kirim_provider_requests_total" in names
    assert "kirim_provider_latency_seconds_bucket" in names
    assert "kirim_in_doubt_deliveries" in names
    assert "kirim_retries" not in names  # a counter is exposed with _total only


def test_alert_rules_have_the_prometheus_structure() -> None:
    doc = yaml.safe_load(ALERTS.read_text())
    assert isinstance(doc["groups"], list)
    assert doc["groups"]
    for group in doc["groups"]:
        assert isinstance(group["name"], str)
        assert group["rules"]
    seen: set[str] = set()
    for rule in rules():
        assert set(rule) == {"alert", "expr", "for", "labels", "annotations"}, rule
        assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", rule["alert"]), rule["alert"]
        assert rule["alert"] not in seen, rule["alert"]
        seen.add(rule["alert"])
        assert isinstance(rule["expr"], str)
        assert rule["expr"].strip()
        assert DURATION.match(str(rule["for"])), rule["for"]
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}
        assert rule["annotations"]["summary"].strip()
        assert rule["annotations"]["description"].strip()


def test_alert_rules_cover_the_operator_signals() -> None:
    exprs = " ".join(rule["expr"] for rule in rules())
    for name in (
        "kirim_multi_request_deliveries_total",
        "kirim_in_doubt_deliveries",
        "kirim_oldest_due_job_age_seconds",
        "kirim_dead_lettered_total",
        "kirim_leases_expired_total",
        "kirim_stale_writes_rejected_total",
    ):
        assert name in NAME.findall(exprs), name


def test_alert_rules_use_only_exported_metrics() -> None:
    names = exported()
    for rule in rules():
        texts = [rule["expr"], *rule["annotations"].values()]
        used = {m for text in texts for m in NAME.findall(text)}
        assert used, rule["alert"]
        assert used <= names, (rule["alert"], sorted(used - names))


def test_dashboard_structure() -> None:
    doc = json.loads(DASHBOARD.read_text())
    assert 36 <= doc["schemaVersion"] <= 41
    variables = {v["name"]: v for v in doc["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource"
    assert variables["DS_PROMETHEUS"]["query"] == "prometheus"
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids))
    for panel in doc["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${DS_PROMETHEUS}", panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${DS_PROMETHEUS}"
            assert target["expr"].strip()
            assert target["refId"]


def test_dashboard_uses_only_exported_metrics() -> None:
    names = exported()
    used: set[str] = set()
    for target in targets():
        found = set(NAME.findall(target["expr"]))
        assert found, target["expr"]
        assert found <= names, (target["expr"], sorted(found - names))
        used |= found
    assert any(n.endswith("_bucket") for n in used)  # latency quantiles exist
    exprs = " ".join(t["expr"] for t in targets())
    assert "histogram_quantile(" in exprs


def test_promtool_accepts_the_rules() -> None:
    """promtool (on PATH, or beside the venv's python where make test puts it) accepts the
    alert rules."""
    beside = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    promtool = shutil.which("promtool", path=beside)
    if promtool is None:
        why = (
            "promtool not on PATH nor in the venv (make test takes it out of Debian's "
            "package prometheus: tests/install_tools.sh)"
        )
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    done = subprocess.run(
        [promtool, "check", "rules", str(ALERTS)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
