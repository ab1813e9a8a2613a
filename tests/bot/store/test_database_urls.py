"""A database the bot does not support (its scheme, or a driver that is not installed) is
refused with exit 2 naming the supported schemes, from the configuration file (with its line)
or RUNBOOK_DB_URL; never a traceback, and never the URL's password."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bot.config import ConfigError, database_url_problem, load_config
from bot.store import db

SUPPORTED = ("use sqlite:///PATH or postgresql://USER@HOST/DATABASE (the bot supports "
             "sqlite://, sqlite+pysqlite://, postgresql://, postgresql+psycopg://)")


def runbook(*argv: str, env: dict[str, str], prelude: str = "") -> subprocess.CompletedProcess[str]:
    code = f"{prelude}import sys; from bot.surfaces.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=60, check=False)


@pytest.mark.parametrize("url", ["mysql://root:hunter2@db/bot", "postgresql+psycopg2://u@h/d",
                                 "oracle://x", "bot.db", "://x"])
def test_an_unsupported_url_is_refused_naming_the_supported(url: str) -> None:
    problem = database_url_problem(url)
    assert problem is not None and problem.endswith(SUPPORTED)
    assert "hunter2" not in problem
    with pytest.raises(db.DatabaseError, match="RUNBOOK_DB_URL") as error:
        db.connect(url)
    assert "hunter2" not in str(error.value)


def test_the_supported_schemes_pass() -> None:
    for url in ("sqlite:////var/lib/bot.db", "sqlite+pysqlite:///bot.db",
                "postgresql://u@h/d", "postgresql+psycopg://u:p@h:5432/d"):
        assert database_url_problem(url) is None


def test_in_the_file_it_is_a_configuration_problem_on_its_line(tmp_path: Path) -> None:
    file = tmp_path / "bot.yaml"
    file.write_text("lab: true\ndatabase_url: mysql://root:hunter2@db/bot\n")
    with pytest.raises(ConfigError) as error:
        load_config(file)
    assert error.value.problems == [
        f'{file}:2: database_url: "mysql://" is not a database the bot supports: {SUPPORTED}']


def test_the_command_line_exits_2_without_a_traceback(tmp_path: Path) -> None:
    done = runbook("status", "1", env={"RUNBOOK_DB_URL": "mysql://root:hunter2@db/bot"})
    assert done.returncode == 2
    assert done.stderr == ('error: the database URL (database_url or RUNBOOK_DB_URL): '
                           f'"mysql://" is not a database the bot supports: {SUPPORTED}\n')


def test_a_missing_driver_is_named_with_how_to_install_it() -> None:
    # psycopg made unimportable in that process, as on an install without the postgres extra
    done = runbook("status", "1", env={"RUNBOOK_DB_URL": "postgresql://u@127.0.0.1:1/d"},
                   prelude="import sys; sys.modules['psycopg'] = None; ")
    assert done.returncode == 2, done.stderr
    assert done.stderr == (
        "error: the database driver for postgresql:// is not installed (psycopg): "
        "install the bot with its postgres extra (pip install 'gpu-runbook-bot[postgres]')\n")
