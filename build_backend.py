"""PEP 517 build backend: setuptools, built against the torch installed where the package goes.

A C++ extension must be compiled against the exact torch it will be loaded into. Plain build
isolation would download the newest torch from the index into a throw-away environment and
build against that, which then fails to load (or loads wrongly) next to the torch the user has.
pip keeps the target environment's prefix while it isolates the build, so this backend looks
for torch in that environment's site-packages; if it is there, those folders are appended to
sys.path for the build (the isolated environment still comes first for setuptools and ninja),
and torch is not asked for. Without an installed torch, torch is a build requirement like any
other and pip installs the same release it will install at run time.
"""
import importlib.metadata
import site
import sys
import sysconfig

from setuptools import build_meta as _setuptools

__all__ = [
    "build_sdist", "build_wheel", "build_editable", "get_requires_for_build_sdist",
    "get_requires_for_build_wheel", "get_requires_for_build_editable",
    "prepare_metadata_for_build_wheel", "prepare_metadata_for_build_editable",
]


def _target_site_packages():
    paths = [sysconfig.get_paths()[key] for key in ("purelib", "platlib")]
    try:
        paths += site.getsitepackages()
    except AttributeError:  # old virtualenv site.py
        pass
    return list(dict.fromkeys(paths))


def _installed_torch():
    paths = _target_site_packages()
    for dist in importlib.metadata.distributions(path=paths):
        if (dist.metadata["Name"] or "").lower() == "torch":
            return dist.version, paths
    return None, paths


def _use_installed_torch():
    version, paths = _installed_torch()
    if version is not None:
        for path in paths:
            if path not in sys.path:
                sys.path.append(path)
    return version


# setuptools would answer these by running setup.py, which imports torch before pip could
# install it; this project has no setup_requires, so the answer is torch or nothing.
def _torch_requirement():
    return [] if _installed_torch()[0] else ["torch"]


def get_requires_for_build_wheel(config_settings=None):
    return _torch_requirement()


def get_requires_for_build_editable(config_settings=None):
    return _torch_requirement()


def get_requires_for_build_sdist(config_settings=None):
    return _torch_requirement()


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    _use_installed_torch()
    return _setuptools.prepare_metadata_for_build_wheel(metadata_directory, config_settings)


def prepare_metadata_for_build_editable(metadata_directory, config_settings=None):
    _use_installed_torch()
    return _setuptools.prepare_metadata_for_build_editable(metadata_directory, config_settings)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    _use_installed_torch()
    return _setuptools.build_wheel(wheel_directory, config_settings, metadata_directory)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    _use_installed_torch()
    return _setuptools.build_editable(wheel_directory, config_settings, metadata_directory)


def build_sdist(sdist_directory, config_settings=None):
    _use_installed_torch()
    return _setuptools.build_sdist(sdist_directory, config_settings)
