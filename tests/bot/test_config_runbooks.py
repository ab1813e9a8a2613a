"""Site runbooks beside the shipped ones (``runbooks: {shipped, paths, exclude}``), and the
older ``runbook_paths``, which replaces them."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from bot.config import ConfigError, load_config, shipped_names, shipped_runbooks
from bot.runbooks.catalogue import KNOWN
from bot.runbooks.loading import RunbookError, load_all, load_file

ARGUMENTS = {name: known[0] for name, known in KNOWN.items()}


def site_runbook(folder: Path, name: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.yaml").write_text(yaml.safe_dump({
        "name": name, "version": "1.0.0", "summary": "the site's own", "risk": "low",
        "steps": [{"id": "say", "action": "chat.notify", "with": {"message": "hi"}}]}))


def config(tmp_path: Path, text: str) -> Path:
    (tmp_path / "etc").mkdir(exist_ok=True)
    file = tmp_path / "etc" / "bot.yaml"
    file.write_text(text)
    return file


def names(file: Path) -> list[str]:
    return sorted(load_all(load_config(file).runbook_paths, ARGUMENTS))


def test_each_shipped_file_is_named_after_its_runbook() -> None:
    """What exclude relies on: a shipped runbook is left out by the name of its file."""
    for file in sorted(shipped_runbooks().glob("*.yaml")):
        assert load_file(file, ARGUMENTS).name == file.stem
    assert len(shipped_names()) == 23


def test_the_sites_folders_add_to_the_shipped_ones(tmp_path: Path) -> None:
    site_runbook(tmp_path / "etc" / "site", "site-check")
    file = config(tmp_path, "runbooks:\n  paths: [site]\n")  # relative to the file
    assert names(file) == sorted([*shipped_names(), "site-check"])


def test_exclude_leaves_shipped_runbooks_out_by_name(tmp_path: Path) -> None:
    site_runbook(tmp_path / "etc" / "site", "restore-etcd")  # the site's own version of it
    file = config(tmp_path, "runbooks:\n  paths: [site]\n  exclude: [restore-etcd, "
                            "upgrade-slurm]\n")
    found = load_all(load_config(file).runbook_paths, ARGUMENTS)
    assert sorted(found) == sorted(shipped_names() - {"upgrade-slurm"})
    assert found["restore-etcd"].runbook.summary == "the site's own"


def test_a_site_runbook_named_like_a_shipped_one_needs_it_excluded(tmp_path: Path) -> None:
    site_runbook(tmp_path / "etc" / "site", "drain-node")
    file = config(tmp_path, "runbooks: {paths: [site]}\n")
    with pytest.raises(RunbookError, match='runbook "drain-node" is also defined in'):
        names(file)


def test_only_the_sites_own_as_before(tmp_path: Path) -> None:
    site_runbook(tmp_path / "etc" / "site", "site-check")
    assert names(config(tmp_path, "runbooks: {shipped: false, paths: [site]}\n")) == [
        "site-check"]
    assert names(config(tmp_path, "runbook_paths: [site]\n")) == ["site-check"]
    assert load_config(config(tmp_path, "lab: true\n")).runbook_paths == [shipped_runbooks()]


@pytest.mark.parametrize(("text", "problem"), [
    ("runbooks:\n  exclude: [drain-nod]\n",
     '2: runbooks.exclude: "drain-nod" is not a shipped runbook (did you mean "drain-node"?)'),
    ("runbooks: {shipped: false, exclude: [drain-node]}\n",
     "1: runbooks: exclude leaves out shipped runbooks, but shipped is false"),
    ("runbook_paths: [site]\nrunbooks: {paths: [site]}\n",
     "1: give runbooks (shipped, paths, exclude) or the older runbook_paths, not both"),
    ("runbooks: {path: [site]}\n", '1: runbooks.path: unknown field (did you mean "paths"?)'),
])
def test_a_wrong_runbooks_section_is_named(tmp_path: Path, text: str, problem: str) -> None:
    file = config(tmp_path, text)
    with pytest.raises(ConfigError) as error:
        load_config(file)
    assert error.value.problems == [f"{file}:{problem}"]
