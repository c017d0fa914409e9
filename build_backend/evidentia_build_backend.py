"""Evidentia's build backend: setuptools, minus one informational notice.

The top-level folders (indexer/, retriever/, ...) install as ``evidentia.<folder>``
on purpose: the layout is the architecture. setuptools then installs an editable
checkout through a meta-path finder and says so in a long "Editable installation
... Please be careful with folders" notice, which pip prints on every
``pip install -e .``. It is information only (nothing to act on), so it is
silenced here; every real warning of setuptools still shows.
"""

import warnings

from setuptools import build_meta as _setuptools_backend

try:
    from setuptools.warnings import InformationOnly
except ImportError:  # older setuptools: nothing to silence
    InformationOnly = None
if InformationOnly is not None:
    warnings.filterwarnings("ignore", category=InformationOnly)

# the hooks pip calls, unchanged
build_wheel = _setuptools_backend.build_wheel
build_sdist = _setuptools_backend.build_sdist
build_editable = _setuptools_backend.build_editable
get_requires_for_build_wheel = _setuptools_backend.get_requires_for_build_wheel
get_requires_for_build_sdist = _setuptools_backend.get_requires_for_build_sdist
get_requires_for_build_editable = _setuptools_backend.get_requires_for_build_editable
prepare_metadata_for_build_wheel = _setuptools_backend.prepare_metadata_for_build_wheel
prepare_metadata_for_build_editable = _setuptools_backend.prepare_metadata_for_build_editable
