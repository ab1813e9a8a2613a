"""The copies the bot writes (restore-slurmdbd's safety copy and upgrade-slurm's dump:
mariadb.dump; restore-etcd's safety snapshot: etcd.snapshot_save) land only inside their
configured folder (mariadb.backup_dir, etcd.backup_dir): a path outside it, with `..`, through
a symbolic link out of it, or naming a link, is refused when the plan is made, and the run
refuses it too, before anything is written."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from adapters.actions import ActionContext, ActionError
from adapters.etcd.actions import EtcdActions, SnapshotSaveArguments
from adapters.etcd.config import EtcdConfig
from adapters.host import confined
from adapters.mariadb import DumpAction, DumpArguments, MariaDBConfig


def context() -> ActionContext:
    return ActionContext(execution_id=1, step_id="backup", deadline=time.monotonic() + 30)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    inside = tmp_path / "backups"
    inside.mkdir()
    (tmp_path / "elsewhere").mkdir()
    (inside / "out").symlink_to(tmp_path / "elsewhere")  # a folder link leading out
    (tmp_path / "elsewhere" / "victim").write_text("keep me\n")
    (inside / "link.sql").symlink_to(tmp_path / "elsewhere" / "victim")
    return inside


def outside(folder: Path) -> list[str]:
    return [str(folder.parent / "elsewhere" / "x.sql"), f"{folder}/../elsewhere/x.sql",
            f"{folder}/out/x.sql", f"{folder}/link.sql", "relative/x.sql", str(folder),
            f"{folder}/x\n.sql", "/etc/cron.d/x"]


def test_a_file_inside_the_folder_is_the_copy(folder: Path) -> None:
    assert confined(f"{folder}/sub/copy.sql", str(folder), "mariadb.backup_dir") == \
        folder / "sub" / "copy.sql"


def test_every_path_out_of_the_folder_is_refused(folder: Path) -> None:
    for path in outside(folder):
        with pytest.raises(ActionError, match=r"mariadb\.backup_dir|symbolic link"):
            confined(path, str(folder), "mariadb.backup_dir")


def test_a_dump_outside_is_refused_at_plan_and_at_run_and_writes_nothing(folder: Path) -> None:
    action = DumpAction(MariaDBConfig(backup_dir=str(folder), dump_command="/bin/false"))
    for path in outside(folder):
        args = DumpArguments(database="slurm_acct_db", path=path)
        with pytest.raises(ActionError):
            action.plan(args)
        with pytest.raises(ActionError):
            action.run(args, context())
    assert (folder.parent / "elsewhere" / "victim").read_text() == "keep me\n"
    assert sorted(p.name for p in (folder.parent / "elsewhere").iterdir()) == ["victim"]
    ok = DumpArguments(database="slurm_acct_db", path=f"{folder}/safety.sql")
    assert action.plan(ok)[0].endswith(f"> {folder}/safety.sql")


def test_a_safety_snapshot_outside_is_refused(folder: Path) -> None:
    config = EtcdConfig(endpoints=["https://10.0.0.1:2379"], backup_dir=str(folder),
                        etcdctl="/bin/false")
    save = {a.name: a for a in EtcdActions(config).all()}["etcd.snapshot_save"]
    for path in [p for p in outside(folder) if p.startswith("/") and "\n" not in p]:
        with pytest.raises(ActionError, match=r"etcd\.backup_dir|symbolic link"):
            save.plan(SnapshotSaveArguments(path=path))
        with pytest.raises(ActionError, match=r"etcd\.backup_dir|symbolic link"):
            save.run(SnapshotSaveArguments(path=path), context())
    assert "snapshot save " + str(folder / "s.db") in save.plan(
        SnapshotSaveArguments(path=str(folder / "s.db")))[0]
