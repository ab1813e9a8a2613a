"""The runbook files that passed their checks, remembered between runs (bot.runbooks.checked):
a file that passed skips its checks next time; a changed file is always checked again (an
error put into a remembered file is still reported, even at the same length); the host
commands checked against are part of the key; a corrupt, truncated, misshapen or unreadable
cache is ignored, never trusted; the service keeps it beside its SQLite database.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from bot.config import Config
from bot.runbooks import checked, loading
from bot.runbooks.checked import Checked
from bot.runbooks.loading import RunbookError, load_all, shipped_arguments
from bot.service import Service

GOOD = textwrap.dedent("""\
    name: hello
    version: 1.0.0
    summary: say hello
    risk: low
    params:
      message: {type: text, default: hi}
    steps:
      - id: say
        action: chat.notify
        with: {message: "{{ message }}"}
    """)
# one character changed, the same length: the template names no parameter now
BAD = GOOD.replace("{{ message }}", "{{ messagf }}")
USES_HOST = GOOD.replace("action: chat.notify\n    with: {message: \"{{ message }}\"}",
                         "action: host.run\n    with: {command: selftest-uname}")


@pytest.fixture
def checks_run(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The runbooks whose checks past the schema ran."""
    ran: list[str] = []
    real = loading._checks

    def counted(runbook, *args, **kwargs):  # type: ignore[no-untyped-def]
        ran.append(runbook.name)
        return real(runbook, *args, **kwargs)

    monkeypatch.setattr(loading, "_checks", counted)
    return ran


def _load(folder: Path, cache: Path, host_commands: list[str] | None = None) -> None:
    load_all([folder], shipped_arguments(), host_commands, checked=Checked.read(cache))


def _folder(tmp_path: Path, text: str) -> Path:
    folder = tmp_path / "runbooks"
    folder.mkdir(exist_ok=True)
    (folder / "hello.yaml").write_text(text)
    return folder


def test_a_file_that_passed_is_not_checked_again(tmp_path: Path, checks_run: list[str]) -> None:
    folder, cache = _folder(tmp_path, GOOD), tmp_path / "checks.json"
    _load(folder, cache)
    _load(folder, cache)
    assert checks_run == ["hello"]
    assert len(json.loads(cache.read_text())["passed"]) == 1


def test_an_error_put_into_a_remembered_file_is_still_reported(
        tmp_path: Path, checks_run: list[str]) -> None:
    folder, cache = _folder(tmp_path, GOOD), tmp_path / "checks.json"
    _load(folder, cache)
    assert len(BAD) == len(GOOD)
    (folder / "hello.yaml").write_text(BAD)
    with pytest.raises(RunbookError, match='template uses "messagf"'):
        _load(folder, cache)
    with pytest.raises(RunbookError, match='template uses "messagf"'):  # never remembered
        _load(folder, cache)
    assert checks_run == ["hello"] * 3


def test_the_key_is_the_text_and_what_it_was_checked_against() -> None:
    cache = Checked(None)
    assert cache.key(GOOD, "a") != cache.key(BAD, "a")
    assert cache.key(GOOD, "a") != cache.key(GOOD, "b")
    assert cache.key(GOOD, "a") == cache.key(GOOD, "a")


def test_host_commands_are_part_of_the_key(tmp_path: Path) -> None:
    assert "host.run" in USES_HOST
    folder, cache = _folder(tmp_path, USES_HOST), tmp_path / "checks.json"
    _load(folder, cache, ["selftest-uname"])
    with pytest.raises(RunbookError, match="not an allow-listed host command"):
        _load(folder, cache, ["something-else"])


@pytest.mark.parametrize("content", [
    "{not json", "", "[]", '{"format": 1, "passed": "x"}', '{"format": 99, "passed": []}',
    '{"format": 1, "passed": [1, 2]}', "\xff\xfe garbage"])
def test_a_corrupt_cache_is_ignored(tmp_path: Path, checks_run: list[str],
                                    content: str) -> None:
    folder, cache = _folder(tmp_path, GOOD), tmp_path / "checks.json"
    cache.write_text(content, errors="surrogateescape")
    _load(folder, cache)
    assert checks_run == ["hello"]
    assert json.loads(cache.read_text())["format"] == checked.FORMAT  # written anew


def test_a_truncated_cache_naming_a_bad_file_is_not_trusted(tmp_path: Path) -> None:
    folder, cache = _folder(tmp_path, BAD), tmp_path / "checks.json"
    key = Checked(None).key(BAD, loading.check_context(shipped_arguments(), None))
    whole = json.dumps({"format": checked.FORMAT, "passed": [key]})
    cache.write_text(whole[:-2])  # cut short, as by a full disk
    with pytest.raises(RunbookError, match='template uses "messagf"'):
        _load(folder, cache)


def test_an_unreadable_cache_is_ignored_and_not_written(tmp_path: Path,
                                                        checks_run: list[str]) -> None:
    folder, cache = _folder(tmp_path, GOOD), tmp_path / "checks.json"
    cache.mkdir()  # neither readable as a file nor replaceable
    _load(folder, cache)
    _load(folder, cache)
    assert checks_run == ["hello", "hello"]


def test_the_service_keeps_it_beside_its_database(tmp_path: Path) -> None:
    folder = _folder(tmp_path, GOOD)
    config = Config.model_validate({
        "database_url": f"sqlite:///{tmp_path / 'bot.db'}", "database": {"create": True},
        "runbook_paths": [str(folder)]})
    assert "hello" in Service.from_config(config).runbooks()
    assert (tmp_path / checked.FILE_NAME).is_file()
    (folder / "hello.yaml").write_text(BAD)
    with pytest.raises(RunbookError, match='template uses "messagf"'):
        Service.from_config(config).runbooks()
