"""An installed package's version, read from its source without importing it."""

from __future__ import annotations

import subprocess
import sys

import requests

from kit.packages import package_version


def test_a_package_version_is_read_not_imported() -> None:
    assert package_version("requests", "__version__.py") == requests.__version__
    assert package_version("no_such_package_here") == "unknown"
    assert package_version("requests", "no_such_file.py") == "unknown"
    assert package_version("requests", "api.py") == "unknown"  # no __version__ line there


def test_reading_it_does_not_import_the_package() -> None:
    code = ("import sys; from kit.packages import package_version; "
            "print(package_version('kubernetes') != 'unknown', 'kubernetes' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True)
    assert done.stdout.split() == ["True", "False"]
