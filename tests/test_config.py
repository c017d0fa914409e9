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
    # the elasticsearch backend needs its URL (Settings.check)
    s = Settings.from_env({"EVIDENTIA_POOL_SIZE": "7", "EVIDENTIA_BACKEND": "ES", "EVIDENTIA_ES_URL": "http://es:9200",
                           "EVIDENTIA_DENSE": "off",
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
    # each was accepted and failed later: an extraction's OverflowError, every page image 500
    ("EVIDENTIA_EXTRACT_TIMEOUT_S", "inf", "must be a positive number of seconds, at most 86400 (a day)"),
    ("EVIDENTIA_EXTRACT_TIMEOUT_S", "3000000", "at most 86400"),
    ("EVIDENTIA_RENDER_TIMEOUT_S", "nan", "at most 86400"),
    ("EVIDENTIA_HYBRID_WEIGHTS", "nan,1", "two weights >= 0"),
    ("EVIDENTIA_HYBRID_WEIGHTS", "inf,1", "two weights >= 0"),
    ("EVIDENTIA_RETRAIN_INTERVAL_S", "100000000000", "from 0 (off) to 31536000 (a year)"),
    ("EVIDENTIA_DENSE_MAX_TOKENS", "4", "a whole number >= 8"),
    # the server started and answered 503 on /ready for ever
    ("EVIDENTIA_DEFAULT_RERANKER", "foo", "must be one of none, llm, classifier, cosine, not 'foo'"),
])
def test_bad_values_name_the_variable_and_what_was_expected(name, raw, expected):
    with pytest.raises(ConfigError) as err:
        Settings.from_env({name: raw})
    assert str(err.value).startswith(name) and expected in str(err.value)


def test_no_float_setting_takes_inf_or_nan_and_no_time_setting_more_than_a_day():
    from evidentia.config import MAX_SECONDS

    floats = [f for f in dataclasses.fields(Settings) if "float" in str(f.type)]
    assert len(floats) > 10
    for f in floats:
        for raw in ("inf", "-inf", "nan", "inf,1", "1,nan"):
            with pytest.raises(ConfigError, match=f"^{env_name(f)} must be"):
                Settings.from_env({env_name(f): raw})
    for f in (f for f in floats if f.name.endswith("_s")):
        assert getattr(Settings.from_env({env_name(f): str(MAX_SECONDS)}), f.name) == MAX_SECONDS
        with pytest.raises(ConfigError, match="at most 86400"):
            Settings.from_env({env_name(f): str(MAX_SECONDS + 1)})


def test_the_default_reranker_names_are_the_registry_s():
    from evidentia.config import RERANKERS
    from evidentia.reranker.registry import reranker_names

    assert list(RERANKERS) == reranker_names()
    assert Settings.from_env({"EVIDENTIA_DEFAULT_RERANKER": "Classifier"}).default_reranker == "classifier"


@pytest.mark.parametrize("env, expected, fixed", [
    ({"EVIDENTIA_DENSE_WINDOW_OVERLAP": "500"},
     "EVIDENTIA_DENSE_WINDOW_OVERLAP must be less than EVIDENTIA_DENSE_MAX_TOKENS - 2 (254), not 500",
     {"EVIDENTIA_DENSE_MAX_TOKENS": "503"}),
    ({"EVIDENTIA_DENSE_MAX_TOKENS": "64", "EVIDENTIA_DENSE_WINDOW_OVERLAP": "62"},
     "EVIDENTIA_DENSE_WINDOW_OVERLAP must be less than EVIDENTIA_DENSE_MAX_TOKENS - 2 (62), not 62",
     {"EVIDENTIA_DENSE_WINDOW_OVERLAP": "61"}),
    ({"EVIDENTIA_POOL_SIZE": "500"}, "EVIDENTIA_POOL_SIZE must be at most EVIDENTIA_MAX_TOP_K (100), not 500",
     {"EVIDENTIA_MAX_TOP_K": "500"}),
    ({"EVIDENTIA_BACKEND": "elasticsearch"}, "EVIDENTIA_BACKEND=elasticsearch needs EVIDENTIA_ES_URL",
     {"EVIDENTIA_ES_URL": "http://es:9200"}),
])
def test_settings_valid_alone_but_not_together_are_refused_at_start_up(env, expected, fixed):
    """Each was accepted by a server, whose /ready then said 503 for ever."""
    with pytest.raises(ConfigError) as err:
        Settings.from_env(env)
    assert str(err.value).startswith(expected) and "\n" not in str(err.value)
    Settings.from_env({**env, **fixed})  # what the limits allow together is accepted


def test_unknown_evidentia_variables_are_named_with_the_closest_setting():
    from evidentia.config import environment_warnings

    env = {"EVIDENTIA_TOP_K": "abc", "EVIDENTIA_POOLSIZE": "3", "EVIDENTIA_XYZZY": "1", "EVIDENTIA_POOL_SIZE": "5",
           "EVIDENTIA_TORCH_THREADS": "2", "EVIDENTIA_UI_SCREENSHOTS": "docs", "OTHER_TOP_K": "1"}
    assert environment_warnings(Settings.from_env(env), env) == [
        "EVIDENTIA_POOLSIZE is not a setting of Evidentia and is ignored; did you mean EVIDENTIA_POOL_SIZE?",
        # `--top-k` overrides the pool size (its help says so): not EVIDENTIA_MAX_TOP_K
        "EVIDENTIA_TOP_K is not a setting of Evidentia and is ignored; did you mean EVIDENTIA_POOL_SIZE?",
        "EVIDENTIA_XYZZY is not a setting of Evidentia and is ignored",
    ]
    assert environment_warnings(Settings.from_env({}), {}) == []


def test_an_elasticsearch_url_without_the_elasticsearch_backend_is_said_to_be_ignored():
    """README (Switching to Elasticsearch) sets both: the URL alone left the embedded index in use."""
    from evidentia.config import environment_warnings

    env = {"EVIDENTIA_ES_URL": "http://localhost:9200"}
    assert environment_warnings(Settings.from_env(env), env) == [
        "EVIDENTIA_ES_URL is set but EVIDENTIA_BACKEND is embedded; set EVIDENTIA_BACKEND=elasticsearch to use it"]
    env["EVIDENTIA_BACKEND"] = "elasticsearch"
    assert environment_warnings(Settings.from_env(env), env) == []


def test_every_evidentia_variable_the_project_reads_is_known():
    """Tests and benchmarks read some EVIDENTIA_ variables that are no setting: the warning about
    unknown names must not flag them (they are listed in NOT_SETTINGS)."""
    from evidentia.config import NOT_SETTINGS, known_variables

    root = README.parent
    read = set()
    for path in root.glob("[!.]*/**/*.py"):
        if ".venv" in path.parts:
            continue
        read.update(re.findall(r"(?:environ\.get\(|environ\[|getenv\()\s*[\"'](EVIDENTIA_[A-Z0-9_]+)",
                               path.read_text(encoding="utf-8")))
    assert "EVIDENTIA_UI_SCREENSHOTS" in read and "EVIDENTIA_ES_URL" in read  # the search finds them
    assert read - set(known_variables()) == set()
    assert set(NOT_SETTINGS) <= read  # no stale entry
