"""``evidentia serve``'s start-up, in process: what it cannot serve with is refused in one
line before the server starts (uvicorn.run is replaced; nothing listens)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from evidentia.cli import app
from tests.utils.server import free_port


@pytest.fixture
def serve(monkeypatch):
    """Run `evidentia serve`; returns (result, whether the server would have started)."""
    import uvicorn

    started = []
    monkeypatch.setattr(uvicorn, "run", lambda *args, **kwargs: started.append(True))

    def invoke():
        result = CliRunner().invoke(app, ["serve", "--port", str(free_port())])
        return result, bool(started)

    return invoke


@pytest.mark.parametrize("env, expected", [
    # each started a server whose /ready answered 503 for ever
    ({"EVIDENTIA_DEFAULT_RERANKER": "foo"},
     "EVIDENTIA_DEFAULT_RERANKER must be one of none, llm, classifier, cosine, not 'foo'"),
    ({"EVIDENTIA_DENSE_WINDOW_OVERLAP": "500"},
     "EVIDENTIA_DENSE_WINDOW_OVERLAP must be less than EVIDENTIA_DENSE_MAX_TOKENS - 2 (254), not 500"),
    # every page image failed (500)
    ({"EVIDENTIA_RENDER_TIMEOUT_S": "inf"},
     "EVIDENTIA_RENDER_TIMEOUT_S must be a positive number of seconds, at most 86400 (a day), not 'inf'"),
])
def test_settings_it_cannot_serve_with_stop_serve_in_one_line(serve, monkeypatch, env, expected):
    for name, raw in env.items():
        monkeypatch.setenv(name, raw)
    result, started = serve()
    assert not started
    assert result.exit_code == 2 and result.stderr == f"error: {expected}\n"


def test_a_data_dir_it_cannot_write_stops_serve_in_one_line(serve, monkeypatch, tmp_path):
    """The store opened in the app's startup: a 60-line traceback and "Application startup failed"."""
    taken = tmp_path / "a-file"
    taken.write_text("not a folder")
    monkeypatch.setenv("EVIDENTIA_DATA_DIR", str(taken))
    result, started = serve()
    assert not started
    assert result.exit_code == 3
    assert result.stderr.startswith(f"error: cannot create the data folder {taken}: ")
    assert result.stderr.endswith("; set EVIDENTIA_DATA_DIR to a folder you can write\n")
    assert result.stderr.count("\n") == 1


def test_serve_warns_about_unknown_variables_and_starts(serve, monkeypatch):
    monkeypatch.setenv("EVIDENTIA_TOP_K", "abc")
    result, started = serve()
    assert started and result.exit_code == 0, result.output
    assert result.stderr == ("warning: EVIDENTIA_TOP_K is not a setting of Evidentia and is ignored; did you mean "
                             "EVIDENTIA_POOL_SIZE?\n")


def test_serve_keeps_the_elasticsearch_clients_log_to_errors(serve, monkeypatch, tmp_path):
    """With the cluster down the client logged each retry with its traceback: 1,029 lines in 12 s."""
    import logging

    monkeypatch.setenv("EVIDENTIA_DATA_DIR", str(tmp_path))
    client_log = logging.getLogger("elastic_transport")
    monkeypatch.setattr(client_log, "level", logging.NOTSET)
    result, started = serve()
    assert started, result.output
    assert client_log.level == logging.ERROR


def test_serve_logs_in_one_format_with_the_apps_access_log(monkeypatch, tmp_path):
    """uvicorn's lines had no time beside the app's timestamped ones, and its access log
    no tenant: the app writes its own (metrics.AccessLogMiddleware, tested in test_api)."""
    import uvicorn

    calls = []
    monkeypatch.setattr(uvicorn, "run", lambda *args, **kwargs: calls.append(kwargs))
    monkeypatch.setenv("EVIDENTIA_DATA_DIR", str(tmp_path))
    assert CliRunner().invoke(app, ["serve", "--port", str(free_port())]).exit_code == 0
    assert calls and calls[0]["log_config"] is None and calls[0]["access_log"] is False


def test_serve_says_where_the_web_page_is_and_warns_while_no_api_key_exists(serve, monkeypatch, tmp_path, caplog):
    """uvicorn says only "running on http://host:port": a newcomer who found the page had
    nothing to sign in with."""
    from evidentia.store import Store, store_path

    monkeypatch.setenv("EVIDENTIA_DATA_DIR", str(tmp_path))
    with caplog.at_level("INFO", logger="evidentia.serve"):
        result, started = serve()
    assert started, result.output
    lines = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "evidentia.serve"]
    assert lines[0][0] == "INFO" and "/ui/" in lines[0][1] and "/docs" in lines[0][1]
    assert lines[1][0] == "WARNING" and "evidentia keys create --tenant default" in lines[1][1]
    store = Store(store_path(tmp_path))
    store.create_key("default")
    store.close()
    caplog.clear()
    with caplog.at_level("INFO", logger="evidentia.serve"):
        result, started = serve()
    assert started and [r.levelname for r in caplog.records if r.name == "evidentia.serve"] == ["INFO"]


def test_keys_delete_takes_the_whole_key_and_never_echoes_its_secret(cli_env):
    """The key pasted whole (`evk_<key_id>_<secret>`, as `keys create` prints it) was
    refused as "unknown key id: evk_…", the secret written back on the terminal."""
    runner = CliRunner()
    key = runner.invoke(app, ["keys", "create", "--tenant", "acme"]).stdout.strip()
    key_id, secret = key.removeprefix("evk_").split("_", 1)
    deleted = runner.invoke(app, ["keys", "delete", key])
    assert deleted.exit_code == 0, deleted.output
    assert deleted.stdout == f"deleted key {key_id}\n" and secret not in deleted.output
    assert key_id not in runner.invoke(app, ["keys", "list"]).stdout
    again = runner.invoke(app, ["keys", "delete", key])
    assert again.exit_code == 1 and again.stderr == f"error: unknown key id: {key_id}\n"
    assert secret not in again.output
