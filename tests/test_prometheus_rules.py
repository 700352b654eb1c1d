"""docs/examples/prometheus-rules.yml, the alerting rules for Alertmanager users: valid for Prometheus
(``promtool check rules``, from Debian's prometheus package, which scripts/test installs) and naming only metrics
RigDash's /metrics exports (node_exporter's for the disk)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from monitoring import prometheus
from tests.test_grafana import metric_names

RULES = Path(__file__).resolve().parent.parent / "docs" / "examples" / "prometheus-rules.yml"
NODE_EXPORTER = {"node_filesystem_avail_bytes", "node_filesystem_size_bytes"}


def test_promtool_accepts_the_rules_file():
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian: apt-get install prometheus; scripts/test does it as root)")
    checked = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 9 rules found" in checked.stdout


def _exported() -> set[str]:
    """Every metric name (with its _total, _bucket... series) RigDash exports."""
    rig = {"name": "r", "model": "m", "up": True, "series": {"busy_slots": 1.0, "gpu0_temperature_c": 50.0},
           "turns_by_user": {}, "agent_up": True, "spill": False}  # fmt: skip
    names = {family.name for family in prometheus.rig_metrics([rig])}
    names |= {metric for metric, _ in prometheus.GAUGES.values()}
    names |= {metric for metric, _ in prometheus.GPU_GAUGES.values()}
    names |= {f"{metric}_bucket" for metric, _ in prometheus.HISTOGRAMS.values()}
    names |= {"rigdash_turns_total", f"{prometheus.rate_limited_metric().name}_total"}
    return names


def test_every_metric_the_rules_name_is_exported():
    rules = yaml.safe_load(RULES.read_text())["groups"][0]["rules"]
    named = set().union(*(metric_names(rule["expr"]) for rule in rules))
    assert named - NODE_EXPORTER <= _exported(), named - NODE_EXPORTER - _exported()
    assert {"rigdash_agent_up", "rigdash_weights_spilled", "rigdash_rate_limited_total"} <= named
