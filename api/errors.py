"""One error shape for everything: ``{"error": {"code", "message", "details"}}``,
for the API's own errors, FastAPI's validation errors, unknown routes and crashes."""

from __future__ import annotations

import logging
import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from evidentia.api.schemas import ErrorResponse

log = logging.getLogger("evidentia.api")

DEFAULT_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "too_large",
    415: "unsupported_media_type",
    422: "validation_error",
    429: "rate_limited",
    500: "internal_error",
    503: "unavailable",
    504: "timeout",
}

DESCRIPTIONS = {
    400: "Malformed request (invalid JSON, unreadable or empty upload).",
    401: "Missing or invalid API key (X-API-Key header or Authorization: Bearer).",
    403: "Forbidden (the admin API is disabled).",
    404: "No such resource for your tenant.",
    409: "A document is not ready (still indexing, or failed), or is gone.",
    413: "Upload too large (bytes or pages).",
    415: "The upload is not a PDF, or a JSON body came without Content-Type: application/json.",
    422: "A field is missing, has the wrong type or is outside its limits.",
    429: "Rate limit of your API key exceeded; retry after Retry-After seconds.",
    503: "Not ready yet, or the search engine / reranker is unavailable.",
    504: "The request took longer than EVIDENTIA_REQUEST_TIMEOUT_S.",
    507: "The server has no space left to store the upload.",
}


def out_of_space(exc: BaseException) -> bool:
    """Whether ``exc`` says the server's disk (or quota) is full: a file write's
    ENOSPC/EDQUOT, or SQLite's "database or disk is full"."""
    import errno
    import sqlite3

    if isinstance(exc, OSError):
        return exc.errno in (errno.ENOSPC, errno.EDQUOT)
    return isinstance(exc, sqlite3.OperationalError) and "disk is full" in str(exc)


def insufficient_storage() -> ApiError:
    return ApiError(507, "insufficient_storage", "the server has no space left to store the file; nothing was kept "
                    "of it: upload it again later")


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, details: Any = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.details = details
        self.headers = headers


def file_too_large(max_upload_bytes: int) -> ApiError:
    """The one answer to an upload over the limit, whether the body's declared size
    or the bytes received give it away."""
    return ApiError(413, "file_too_large", f"the file is over the upload limit of {max_upload_bytes} bytes "
                    "(EVIDENTIA_MAX_UPLOAD_BYTES)", {"max_bytes": max_upload_bytes})


def body_too_large(max_body_bytes: int) -> ApiError:
    return ApiError(413, "too_large", f"request body over the limit of {max_body_bytes} bytes",
                    {"max_bytes": max_body_bytes})


# a server's file path (two or more segments) or URL inside an exception's text
_SERVER_PATH = re.compile(r"(?<![\w.])(?:[A-Za-z]:\\|/)(?:[^\s'\"`,;:()<>]+[\\/])+[^\s'\"`,;:()<>]*")
_URL = re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"`<>]*[^\s'\"`<>:.,;]")


def without_server_details(text: str) -> str:
    """An exception's text as an HTTP client may read it: the server's file paths and
    URLs (a model directory, Elasticsearch's address) replaced; the server's log keeps
    them."""
    return _SERVER_PATH.sub("<path on the server>", _URL.sub("<server URL>", text))


# What a client sent, echoed in an error: a prefix is enough to recognise it, and a megabyte's
# value must not come back twice (message and details) in a multi-megabyte 422
ECHO_CHARS = 100
MAX_MESSAGE_CHARS = 1000
_LONG_RUN = re.compile(r"\S{%d,}" % (ECHO_CHARS + 1))

NO_FILE_MESSAGE = ("no file: send the PDF as the form's `file` part, with its file name (a form cut short before "
                   "its end loses it too)")


def no_file_message(media_type: str) -> str:
    """What an upload without a file part is told, by its Content-Type ``media_type``: a
    PDF sent as the raw body (`curl --data-binary @x.pdf`) is no form at all, and was told
    only of the form's part."""
    if media_type.lower() == "multipart/form-data":
        return NO_FILE_MESSAGE
    said = (f"this request's Content-Type is {bounded_echo(media_type)!r}" if media_type
            else "this request has no Content-Type")
    return ("no file: send the PDF as the `file` part of a multipart/form-data body, with its file name "
            f"(`curl -F file=@report.pdf`); {said}")


def bounded_echo(text: str) -> str:
    """``text`` with every run of more than ECHO_CHARS non-space characters (an echoed
    value: 'rrrr...', a 4000-digit number) cut to its first ECHO_CHARS and "…", and the
    whole kept under MAX_MESSAGE_CHARS (a long value with spaces in it)."""
    text = _LONG_RUN.sub(lambda m: m.group()[:ECHO_CHARS] + "…", text)
    return text if len(text) <= MAX_MESSAGE_CHARS else text[:MAX_MESSAGE_CHARS] + "…"


def backend_unavailable(exc: Exception) -> ApiError:
    """The search engine failed (Elasticsearch down, the index unreadable): 503."""
    return ApiError(503, "backend_unavailable", f"search engine error: {without_server_details(str(exc))}")


def error_content(code: str, message: str, details: Any = None) -> dict:
    return {"error": {"code": code, "message": message, "details": details}}


def error_response(status: int, code: str, message: str, details: Any = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_content(code, message, details), status_code=status, headers=headers)


def errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses=`` entry documenting the given error statuses."""
    return {c: {"model": ErrorResponse, "description": DESCRIPTIONS[c]} for c in codes}


def _loc(loc) -> str:
    return ".".join(str(p) for p in loc)


def _bounded_loc(loc) -> list:
    """A location whose parts may be the client's own keys (an unknown field's name)."""
    return [bounded_echo(p) if isinstance(p, str) else p for p in loc]


def not_json_body(media_type: str, raw: list[dict]) -> bool:
    """The route wanted a JSON object and the request (of ``media_type``) did not say its body is JSON."""
    kind = media_type.lower()
    is_json = kind == "application/json" or (kind.startswith("application/") and kind.endswith("+json"))
    return not is_json and any(tuple(e.get("loc", ())) == ("body",) and e.get("type") in ("model_attributes_type",
                                                                                          "dict_type", "missing")
                               for e in raw)


def install_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.status, exc.code, exc.message, exc.details, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        raw = exc.errors()
        details = [{"loc": _bounded_loc(e.get("loc", ())), "message": bounded_echo(str(e.get("msg", ""))),
                    "type": e.get("type", "")} for e in raw]
        if any(e.get("type") == "json_invalid" for e in raw):
            return error_response(400, "invalid_json", "the request body is not valid JSON", details)
        sent = request.headers.get("content-type", "").split(";")[0].strip()
        if not_json_body(sent, raw):  # FastAPI reads such a body as a string, then "not a dictionary"
            said = f"this request's is {bounded_echo(sent)!r}" if sent else "this request has none"
            return error_response(415, "unsupported_media_type",
                                  f"the body must be JSON, sent with Content-Type: application/json ({said})")
        for d in details:  # a form without a file part (or cut short), or a file part without a filename
            if d["loc"] == ["body", "file"] and ("Expected UploadFile" in d["message"] or d["type"] == "missing"):
                d["message"] = no_file_message(sent)
        parts = [f"{_loc(d['loc'])}: {d['message']}" for d in details[:3]]
        more = f" (and {len(details) - 3} more)" if len(details) > 3 else ""
        return error_response(422, "validation_error", "; ".join(parts) + more, details)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = getattr(exc, "code", None) or DEFAULT_CODES.get(exc.status_code, "error")
        message = exc.detail if isinstance(exc.detail, str) else code
        if exc.status_code == 404 and message == "Not Found":
            message = f"no such endpoint: {request.method} {request.url.path} (see /docs)"
        elif exc.status_code == 405:
            message = f"method {request.method} not allowed on {request.url.path}"
        elif exc.status_code == 400 and message == "There was an error parsing the body":
            message = "the request body cannot be parsed (send multipart/form-data or JSON as documented)"
        elif exc.status_code == 400 and message == "Invalid multipart data.":
            # the multipart parser's own words: a part's headers over 4 KB (a file name of
            # thousands of characters) or not headers at all
            message = ("the multipart/form-data body cannot be read: a part's headers are malformed or longer "
                       "than 4 KB (a file name of thousands of characters?); send the PDF as the `file` part "
                       "with a shorter name")
        return error_response(exc.status_code, code, message, getattr(exc, "details", None),
                              getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _crash(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return error_response(500, "internal_error", "internal error; the server log has the details")
