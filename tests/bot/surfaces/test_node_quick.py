"""``runbook node`` starts quickly and shows the same: it imports no SQLAlchemy, no
catalogue, no action and no official Kubernetes client (a subprocess reads
``sys.modules``), reads the executions of many nodes in one query with the rows
``executions.find`` gives, lists Slurm once, and takes hostlists; a view of many Kubernetes
nodes (two requests) equals the per-node one."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from adapters.kubernetes.backend import Pod
from adapters.kubernetes.fake import FakeKubernetes
from adapters.slurm.backend import SlurmError
from adapters.slurm.fake import FakeSlurm
from bot.execution import executions
from bot.execution.engine import Engine
from bot.runbooks.params import Inventory
from bot.service import Service
from bot.store import db, recent
from bot.surfaces import nodeview
from bot.surfaces.nodeparts import OneListing
from tests.bot import fakes
from tests.bot.execution.test_engine import record, runbook
from tests.conftest import NODES, BotFactory

# what the node command must not import: the store's ORM layer, the planner, the
# catalogue of every adapter's actions, the template engine, the migrations, the official
# Kubernetes client and requests (adapters.kubernetes.quickread, adapters.prometheus.quick)
NOT_FOR_NODE = ("sqlalchemy", "alembic", "jinja2", "bot.service", "bot.store.db",
                "bot.execution.planning", "bot.runbooks.catalogue", "bot.runbooks.model",
                "adapters.slurm.actions", "adapters.kubernetes.actions",
                "adapters.prometheus.actions", "adapters.etcd.actions", "kubernetes",
                "adapters.kubernetes.client", "requests", "prometheus_api_client")
PROBE = """
import json, sys
from bot.surfaces.cli import main
code = main(["--config", sys.argv[1], "node", *sys.argv[2:]])
sys.stdout.write("\\nMODULES " + json.dumps(sorted(sys.modules)) + "\\n")
sys.exit(code)
"""


def test_the_node_command_imports_only_what_it_reads(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'bot.db'}"
    db.connect(url).dispose()  # at the head revision, as any earlier command leaves it
    kubeconfig = tmp_path / "kubeconfig"  # a token: read without the official client
    kubeconfig.write_text(yaml.safe_dump({
        "current-context": "c", "contexts": [{"name": "c", "context": {"cluster": "k",
                                                                         "user": "u"}}],
        "clusters": [{"name": "k", "cluster": {"server": "http://127.0.0.1:9"}}],
        "users": [{"name": "u", "user": {"token": "t"}}]}))
    config = tmp_path / "bot.yaml"
    config.write_text(yaml.safe_dump({"database_url": url, "inventory": {
        "nodes": ["gpu01", "gpu02"], "discover": False},
        "kubernetes": {"kubeconfig": str(kubeconfig)},
        "prometheus": {"url": "http://127.0.0.1:9", "retries": 0}}))
    done = subprocess.run([sys.executable, "-c", PROBE, str(config), "gpu01"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    shown, _, modules = done.stdout.rpartition("\nMODULES ")
    view, problem = shown.strip().splitlines()  # the query went out, without requests
    assert view == "node gpu01: serves slurm"
    assert problem.startswith("  ! Prometheus: Prometheus at http://127.0.0.1:9 is not "
                              "answering (connection refused; 1 attempt in ")
    loaded = set(json.loads(modules))
    assert {"bot.surfaces.nodeview", "pydantic", "adapters.kubernetes.quickread",
            "adapters.prometheus.quick"} <= loaded
    assert sorted(m for m in NOT_FOR_NODE if m in loaded) == []


def test_one_query_gives_the_rows_find_gives_newest_ten(make_bot: BotFactory,
                                                        db_url: str) -> None:
    fakes.reset()
    bot = make_bot({"demo": runbook([record("a", "{{ node }}")], risk="low")}, url=db_url)
    engine = Engine(bot, sleep=lambda s: None)
    for node in ["gpu01"] * 12 + ["gpu02"] * 2:
        engine.drive(bot.request("demo", {"node": node}, "alice"))
    engine.close()
    quick = recent.quick_sqlite(bot.config.resolved_database_url())
    assert (quick is None) == db_url.startswith("postgresql")
    for source in (quick, bot.db) if quick else (bot.db,):  # sqlite3 alone; SQLAlchemy
        rows = recent.by_node(source, ["gpu01", "gpu02", "gpu03"], 10)
        for node in ("gpu01", "gpu02", "gpu03"):
            with bot.db.connect() as conn:
                want = [(ex.id, ex.runbook, ex.state, ex.requested_by)
                        for ex in executions.find(conn, node=node, limit=10)]
            assert [(r["id"], r["runbook"], r["state"], r["requested_by"])
                    for r in rows if r["node"] == node] == want
    assert len([r for r in rows if r["node"] == "gpu01"]) == 10


def test_only_a_sqlite_file_at_the_head_revision_is_read_without_sqlalchemy(
        tmp_path: Path) -> None:
    file = tmp_path / "bot.db"
    assert recent.quick_sqlite(f"sqlite:///{file}") is None  # not there: connect makes it
    db.connect(f"sqlite:///{file}").dispose()
    assert recent.quick_sqlite(f"sqlite:///{file}") == recent.SqliteFile(file)
    assert recent.quick_sqlite(f"sqlite:///{file}?timeout=5") is None
    assert recent.quick_sqlite("postgresql://bot@db/bot") is None
    with sqlite3.connect(file) as conn:
        conn.execute("UPDATE alembic_version SET version_num = '0001'")
    assert recent.quick_sqlite(f"sqlite:///{file}") is None  # behind: connect migrates


class Counting(FakeSlurm):
    def __init__(self, nodes: list[str], fail: int = 0) -> None:
        super().__init__(nodes)
        self.listings, self.fail = 0, fail

    def nodes(self, names: list[str] | None = None, *, with_jobs: bool = True) -> list[Any]:
        self.listings += 1
        if self.listings <= self.fail:
            raise SlurmError("slurmctld is not answering", ["sinfo"])
        return super().nodes(names, with_jobs=with_jobs)


def test_slurm_is_listed_once_for_the_inventory_and_the_view() -> None:
    slurm = Counting(NODES)
    listing = OneListing(slurm)
    listing.start()
    assert [n.name for n in listing.nodes(None, with_jobs=False)] == NODES
    assert [n.name for n in listing.nodes(["gpu03", "gpu01", "gpu99"])] == ["gpu03", "gpu01"]
    assert slurm.listings == 1
    failing = OneListing(Counting(NODES, fail=1))
    with pytest.raises(SlurmError):  # the error reaches the first caller...
        failing.nodes(None)
    assert [n.name for n in failing.nodes(["gpu02"])] == ["gpu02"]  # ...the next asks again


def test_many_kubernetes_nodes_show_as_one_at_a_time(make_bot: BotFactory) -> None:
    fakes.reset()
    names = [f"k{i:02d}" for i in range(nodeview.BULK + 4)]
    bot: Service = make_bot({})
    kubernetes = FakeKubernetes(names)
    kubernetes.nodes["k03"] = replace(kubernetes.nodes["k03"], unschedulable=True)
    kubernetes.pods = [Pod("ml", f"job-{i}", f"uid-{i}", node=names[i % 3], ready=True)
                       for i in range(7)] + [Pod("ml", "pending", "uid-p")]
    bot.backends = {"kubernetes": kubernetes}
    bot.inventory = Inventory(nodes=frozenset(names), slurm=frozenset(),
                              kubernetes=frozenset(names))
    together = "\n".join(nodeview.text(v) for v in nodeview.build(bot, names))
    alone = "\n".join(nodeview.text(nodeview.build(bot, [n])[0]) for n in names)
    assert together == alone
    assert "k03: serves kubernetes\n  Kubernetes: cordoned" in together
    assert together.count("pod ml/job-") == 7 and "pending" not in together


@pytest.mark.parametrize(("given", "shown"), [
    ([], ["gpu01", "gpu02", "gpu03"]),
    (["gpu[01-02]", "gpu01"], ["gpu01", "gpu02"]),
])
def test_no_name_is_every_node_and_a_hostlist_its_nodes(
        tmp_path: Path, given: list[str], shown: list[str],
        capsys: pytest.CaptureFixture[str]) -> None:
    from bot.surfaces import cli

    config = tmp_path / "bot.yaml"
    config.write_text(yaml.safe_dump({"database_url": f"sqlite:///{tmp_path / 'bot.db'}",
                                      "inventory": {"nodes": ["gpu03", "gpu01", "gpu02"],
                                                    "discover": False}}))
    db.init(f"sqlite:///{tmp_path / 'bot.db'}")  # `runbook db init`
    assert cli.main(["--config", str(config), "node", *given]) == cli.EXIT_OK
    out = capsys.readouterr().out
    assert [line.split()[1].rstrip(":") for line in out.splitlines()
            if line.startswith("node ")] == shown
    assert cli.main(["--config", str(config), "node", "gpu[02-"]) == cli.EXIT_BAD_INPUT
    assert "gpu[02-" in capsys.readouterr().err
