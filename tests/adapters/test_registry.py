"""The adapters' registry: every system declares itself once, the bot's configuration has a
typed section for each, every action is known under the section that enables it, and an
adapter is built only after the adapters it uses."""

from __future__ import annotations

import subprocess
import sys
import typing
from collections.abc import Mapping
from typing import Any

import pytest

from adapters.registry import Adapter, Built, _used_first, registered
from bot.config import Config
from bot.runbooks.catalogue import KNOWN


def test_every_system_registers_itself() -> None:
    names = [adapter.name for adapter in registered()]
    assert sorted(names) == ["alertmanager", "drift", "etcd", "fairshare", "kubernetes",
                             "mariadb", "prometheus", "reports", "slurm", "upgrades"]
    assert names.index("prometheus") < names.index("drift")
    assert names.index("slurm") < names.index("reports")
    assert names.index("prometheus") < names.index("reports")
    assert names.index("kubernetes") < names.index("fairshare")


@pytest.mark.parametrize("adapter", registered(), ids=lambda adapter: adapter.name)
def test_the_configuration_has_a_typed_section(adapter: Adapter) -> None:
    field = Config.model_fields[adapter.section]
    assert adapter.config_class in typing.get_args(field.annotation), field.annotation
    assert field.default is None  # an adapter is enabled by configuring its section


@pytest.mark.parametrize("adapter", registered(), ids=lambda adapter: adapter.name)
def test_its_actions_are_known_under_its_section(adapter: Adapter) -> None:
    for cls in adapter.action_classes:
        assert KNOWN[cls.name] == (cls.Arguments, adapter.section)


def _entry(name: str, *uses: str) -> Adapter:
    def build(config: Any, backends: Mapping[str, Any]) -> Built:
        return Built([])

    return Adapter(name, name, object, (), build, uses=uses)


def test_used_adapters_come_first_and_a_cycle_is_refused() -> None:
    found = {e.name: e for e in (_entry("c", "b"), _entry("b", "a"), _entry("a"))}
    assert [e.name for e in _used_first(found)] == ["a", "b", "c"]
    cycle = {e.name: e for e in (_entry("a", "b"), _entry("b", "a"))}
    with pytest.raises(RuntimeError, match="use each other"):
        _used_first(cycle)


def test_importing_one_module_of_a_package_loads_not_its_actions() -> None:
    code = ("import sys, kit.hostlist, adapters.kubernetes.config; "
            "print(sorted(m for m in sys.modules if m.endswith('.actions') "
            "or m.endswith('.client')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True)
    assert done.stdout.strip() == "[]", done.stdout


def test_the_slurm_entry_builds_each_of_its_action_classes_once() -> None:
    """One list per adapter, built in one place: every class of it, the GPU-gated ones with
    the configured Prometheus and settle time."""
    from adapters.prometheus.gate import GpuGated
    from adapters.slurm.adapter import ADAPTER
    from adapters.slurm.config import SlurmConfig

    class Prometheus:
        class config:  # stands for a PrometheusConfig
            gpu_settle = 7.0

    prometheus: Any = Prometheus()
    built = ADAPTER.build(SlurmConfig(), {"prometheus": prometheus})
    assert [type(action) for action in built.actions] == list(ADAPTER.action_classes)
    gated = [action for action in built.actions if isinstance(action, GpuGated)]
    assert {action.name for action in gated} >= {"slurm.health_check", "slurm.resume_batches"}
    assert all(a.prometheus is prometheus and a.gpu_settle == 7.0 for a in gated)
