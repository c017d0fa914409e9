"""``evidentia serve`` and ``evidentia keys``. Only typer and evidentia.console (which
evidentia.cli has imported already) are imported at module level, so `evidentia --help`
stays fast; FastAPI and uvicorn load when serving."""

from __future__ import annotations

import json

import typer

from evidentia.console import App


def _settings():
    from evidentia.console import read_settings

    return read_settings()


def serve_command(
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (0.0.0.0 in a container)."),
    port: int = typer.Option(8000, "--port", help="TCP port."),
    log_level: str = typer.Option("info", "--log-level", help="critical, error, warning, info or debug."),
):
    """Run the validation API (HTTP, OpenAPI docs at /docs) on the configured backend."""
    import logging

    import uvicorn

    from evidentia.api.app import create_app
    from evidentia.config import ConfigError

    from evidentia.console import EXIT_BACKEND, fail

    if log_level.lower() not in ("critical", "error", "warning", "info", "debug"):
        raise fail(f"--log-level {log_level!r}: use critical, error, warning, info or debug")
    log_level = log_level.lower()
    # before anything loads: a port in use was found only after the models loaded
    # and "Application startup complete", as uvicorn's bare [Errno 98]
    problem = listen_problem(host, port)
    if problem:
        raise fail(problem)
    settings = _settings()
    # the store opens in the app's startup, where an unusable EVIDENTIA_DATA_DIR was a
    # 60-line traceback and uvicorn's "Application startup failed"
    problem = data_dir_problem(settings.data_dir)
    if problem:
        raise fail(problem, EXIT_BACKEND)
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if log_level != "debug":
        # Elasticsearch's client logs every request at INFO, and each retry of a cluster that
        # is down as a warning with its traceback: 1,029 lines in 12 s. The server says once
        # per new reason that the cluster cannot be reached (Services._check_failed)
        logging.getLogger("elastic_transport").setLevel(logging.ERROR)
    app = create_app(settings)
    try:  # probes Tesseract now: a bad EVIDENTIA_OCR_LANGUAGES stops here, in one line, not in the app's startup
        app.state.services.engine.ocr  # noqa: B018
    except ConfigError as exc:
        raise fail(str(exc))
    _announce(host, port, settings)
    # One process: the store, the indexing worker and the cached models are per
    # process (and tantivy allows one writer); scale with threads, not workers.
    # log_config=None: uvicorn's lines take the format above (they had no time, beside timestamped ones);
    # its access log is the app's (metrics.AccessLogMiddleware), which says whose request it was
    uvicorn.run(app, host=host, port=port, log_level=log_level, log_config=None, access_log=False,
                timeout_graceful_shutdown=10,
                **server_limits(settings))


def _announce(host: str, port: int, settings) -> None:
    """Where the web page and the API's documentation are, and a warning when no API key
    exists yet: uvicorn says only "running on http://host:port", and a newcomer who opened
    the page then had nothing to sign in with."""
    import logging

    from evidentia.store import Store, store_path

    log = logging.getLogger("evidentia.serve")
    shown = "localhost" if host in ("0.0.0.0", "::", "") else f"[{host}]" if ":" in host else host
    base = f"http://{shown}:{port}"
    log.info("web page: %s/ui/ ; API documentation: %s/docs", base, base)
    store = Store(store_path(settings.data_dir))
    try:
        keys = len(store.list_keys())
    finally:
        store.close()
    if not keys:
        admin = " or POST /v1/admin/keys with EVIDENTIA_ADMIN_KEY" if settings.admin_key else ""
        log.warning("no API key yet, so neither the web page nor the API can be used: `evidentia keys create "
                    "--tenant default` makes one (with this EVIDENTIA_DATA_DIR)%s", admin)


def listen_problem(host: str, port: int) -> str | None:
    """Why the server could not listen on host:port (None: it can), in one line."""
    import errno
    import socket

    if not 0 < port < 65536:
        return f"--port {port}: use a TCP port from 1 to 65535"
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        return f"--host {host}: not an address of this machine ({exc.strerror})"
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            probe.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return f"--port {port}: {host}:{port} is already in use (another server?); choose another --port"
            return f"--host {host} --port {port}: cannot listen there ({exc.strerror or exc})"
    return None


def data_dir_problem(data_dir) -> str | None:
    """Why the server could not keep its store in ``data_dir`` (None: it can), in one line,
    worded as the CLI's (retriever/tantivy_backend.py). Opens the store as the startup would."""
    from evidentia.store import Store, StoreError, store_path

    try:
        Store(store_path(data_dir)).close()
    except OSError as exc:
        return (f"cannot create the data folder {exc.filename or data_dir}: {exc.strerror or exc}; set "
                "EVIDENTIA_DATA_DIR to a folder you can write")
    except StoreError as exc:  # a folder it cannot write, a store of another schema version
        return str(exc)
    return None


def server_limits(settings) -> dict:
    """uvicorn options that bound what clients can hold: connections (503
    beyond), the time to send headers and body (slow clients are dropped, see
    api/http_guard.py) and idle keep-alive."""
    from evidentia.api.http_guard import guarded_h11_protocol

    return {
        "http": guarded_h11_protocol(settings.http_header_timeout_s, settings.http_body_timeout_s),
        "limit_concurrency": settings.http_max_connections,
        "timeout_keep_alive": settings.http_keep_alive_s,
        "h11_max_incomplete_event_size": 64 * 1024,  # request line + headers
    }


keys_app = App(no_args_is_help=True, help="API keys of the validation API (written to its store).")


def _store():
    from evidentia.store import store_path
    from evidentia.store import Store, StoreError
    from evidentia.console import fail

    try:
        return Store(store_path(_settings().data_dir))
    except StoreError as exc:
        raise fail(str(exc), 3)


@keys_app.command("create")
def keys_create(tenant: str = typer.Option(..., "--tenant", help="Tenant the key acts for (created on first use)."),
                as_json: bool = typer.Option(False, "--json", help="Print one JSON object.")):
    """Create an API key; the key is printed once (stdout), only its salted hash is stored."""
    from evidentia.console import fail

    store = _store()
    try:
        new = store.create_key(tenant)
    except ValueError as exc:
        raise fail(str(exc))
    finally:
        store.close()
    if as_json:
        typer.echo(json.dumps({"key_id": new.info.key_id, "tenant": new.info.tenant, "created": new.info.created,
                               "key": new.key}))
    else:
        typer.echo(f"created key {new.info.key_id} for tenant {new.info.tenant}; it is shown once:", err=True)
        typer.echo(new.key)


@keys_app.command("list")
def keys_list():
    """List key ids and tenants (never the keys)."""
    store = _store()
    try:
        keys = store.list_keys()
    finally:
        store.close()
    if not keys:
        typer.echo("no API key")
    for k in keys:
        typer.echo(f"{k.key_id}\t{k.tenant}\t{k.created}")


@keys_app.command("delete")
def keys_delete(key_id: str = typer.Argument(..., help="The key id (from `evidentia keys list`), or the whole key.")):
    """Revoke a key."""
    from evidentia.console import EXIT_BAD_INPUT, fail
    from evidentia.store import split_key

    # the whole key pasted (evk_<key_id>_<secret>): its id; no message repeats the secret
    key_id = (split_key(key_id) or (key_id,))[0]
    store = _store()
    try:
        deleted = store.delete_key(key_id)
    finally:
        store.close()
    if not deleted:
        raise fail(f"unknown key id: {key_id}", EXIT_BAD_INPUT)
    typer.echo(f"deleted key {key_id}")
