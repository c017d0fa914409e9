"""Fixtures of the in-process API tests: one app per test module (its own data dir), and
the sample report most of them upload."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from evidentia.samples import write_sample_report
from tests.utils.api import make_app, wait_ready


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    """A TestClient on an app of the module's own (tests isolate themselves by tenant)."""
    with TestClient(make_app(tmp_path_factory.mktemp("api"))) as c:
        wait_ready(c)
        yield c


@pytest.fixture(scope="module")
def sample_pdf(tmp_path_factory) -> Path:
    return write_sample_report(tmp_path_factory.mktemp("pdfs") / "acme-2023.pdf")
