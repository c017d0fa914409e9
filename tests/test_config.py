"""Settings: declared once, parsed from the environment, and documented in the
README by a table generated from the same declarations."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from evidentia.config import ConfigError, Settings, env_name, settings_table

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_settings_table_is_the_generated_one():
    text = README.read_text(encoding="utf-8")
    found = re.search(r"<!-- settings-table:start -->\n(.*?)\n<!-- settings-table:end -->", text, re.S)
    assert found, "README.md lost its settings table markers"
    assert found.group(1).strip() == settings_table(), (
        "README settings table differs from evidentia/config.py: paste `python -m evidentia.config` into it")


def test_every_setting_has_help_and_a_documented_variable():
    table = settings_table()
    for f in dataclasses.fields(Settings):
        assert f.metadata["help"], f.name
        assert f"`{env_name(f)}`" in table


def test_from_env_parses_and_checks_each_kind():
    s = Settings.from_env({"EVIDENTIA_POOL_SIZE": "7", "EVIDENTIA_BACKEND": "ES", "EVIDENTIA_DENSE": "off",
                           "EVIDENTIA_HYBRID_WEIGHTS": "1, 0.5", "EVIDENTIA_CLASSIFIER_THRESHOLD": "0.3",
                           "EVIDENTIA_DATA_DIR": "~/x", "EVIDENTIA_DEFAULT_RERANKER": " LLM ",
                           "OPENAI_API_KEY": "sk-fallback"})
    assert (s.pool_size, s.backend, s.dense, s.hybrid_weights, s.classifier_threshold) == \
        (7, "elasticsearch", False, (1.0, 0.5), 0.3)
    assert s.data_dir == Path("~/x").expanduser() and s.default_reranker == "llm"
    assert s.llm_api_key == "sk-fallback"  # the openai client's own variable is honoured
    assert Settings.from_env({"EVIDENTIA_LLM_API_KEY": "mine", "OPENAI_API_KEY": "x"}).llm_api_key == "mine"
    assert Settings.from_env({}) == Settings() and Settings.from_env({"EVIDENTIA_POOL_SIZE": "  "}) == Settings()


@pytest.mark.parametrize("name, raw, expected", [
    ("EVIDENTIA_POOL_SIZE", "0", "must be a positive integer, not '0'"),
    ("EVIDENTIA_LLM_MAX_RETRIES", "-1", "must be a whole number >= 0"),
    ("EVIDENTIA_CLASSIFIER_THRESHOLD", "1.5", "must be a number between 0 and 1"),
    ("EVIDENTIA_STAGE", "sparse", "must be one of bm25, dense, hybrid"),
    ("EVIDENTIA_DENSE", "maybe", "must be on or off"),
    ("EVIDENTIA_HYBRID_WEIGHTS", "0,0", "two weights >= 0"),
])
def test_bad_values_name_the_variable_and_what_was_expected(name, raw, expected):
    with pytest.raises(ConfigError) as err:
        Settings.from_env({name: raw})
    assert str(err.value).startswith(name) and expected in str(err.value)
