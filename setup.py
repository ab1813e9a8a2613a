"""Puts the shipped runbooks (runbooks/*.yaml) into the wheel as bot/_runbooks, where
bot.config.shipped_runbooks() looks for them in an installed bot. Everything else is in
pyproject.toml."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildWithRunbooks(build_py):
    def run(self) -> None:
        super().run()
        target = Path(self.build_lib) / "bot" / "_runbooks"
        target.mkdir(parents=True, exist_ok=True)
        for runbook in sorted(Path(__file__).parent.glob("runbooks/*.yaml")):
            shutil.copy2(runbook, target / runbook.name)


setup(cmdclass={"build_py": BuildWithRunbooks})
