"""The analysts' web page: static files from api/static/ at /ui, and / redirecting there;
and the API's interactive documentation at /docs, served from this server too.

Plain HTML, CSS and JavaScript modules: nothing to build, nothing fetched from
elsewhere. The page calls the same /v1 API with the key the analyst types (kept
in the tab's sessionStorage); it gets no privilege of its own. A strict
Content-Security-Policy keeps scripts to this origin's files, so text from a
PDF can never run as code even if it were inserted as HTML by mistake.
"""

from __future__ import annotations

import base64
import hashlib
import re
from pathlib import Path

from fastapi import APIRouter, FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles

STATIC_DIR = Path(__file__).resolve().parent.parent / "static"

SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' blob: data:; "
                               "connect-src 'self'; form-action 'none'; base-uri 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-cache",  # revalidate: a new server version is picked up at once
}

router = APIRouter(include_in_schema=False)


# HEAD too (`curl -I`, uptime checks): a GET-only route answers it 405
@router.api_route("/", methods=["GET", "HEAD"])
def root() -> RedirectResponse:
    return RedirectResponse("/ui/", status_code=307)


@router.api_route("/ui", methods=["GET", "HEAD"])
def ui_no_slash() -> RedirectResponse:
    return RedirectResponse("/ui/", status_code=307)


class _UiFiles(StaticFiles):
    async def get_response(self, path, scope):
        response = await super().get_response(path, scope)
        response.headers.update(SECURITY_HEADERS)
        return response


def install_ui(app: FastAPI) -> None:
    """Adds the page to ``app``: / -> /ui/, and the files under /ui/."""
    app.include_router(router)
    app.mount("/ui", _UiFiles(directory=STATIC_DIR, html=True, check_dir=False), name="ui")


# FastAPI's /docs and /redoc load Swagger UI and ReDoc from a CDN (and ReDoc Google's fonts):
# on a network without the internet, the server's own documentation was a blank page. Swagger
# UI's files come with the `swagger-ui-bundle-v2` package and are served here; ReDoc is not.
DOCS_ASSETS = "/docs/assets"
_INLINE_SCRIPT = re.compile(r"<script>(.*?)</script>", re.S)


def _docs_headers(html: str) -> dict[str, str]:
    """The page's Content-Security-Policy: this origin's files, and its one inline script
    (the Swagger UI call FastAPI writes) by its hash, nothing else."""
    hashes = " ".join(f"'sha256-{base64.b64encode(hashlib.sha256(m.encode()).digest()).decode()}'"
                      for m in _INLINE_SCRIPT.findall(html))
    return {"Content-Security-Policy": f"default-src 'none'; script-src 'self' {hashes}; style-src 'self'; "
                                       "img-src 'self' data:; connect-src 'self'; base-uri 'none'; "
                                       "frame-ancestors 'none'",
            "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"}


def install_docs(app: FastAPI) -> None:
    """/docs from this server's files (``app`` made with docs_url=None, redoc_url=None)."""
    from swagger_ui_bundle import swagger_ui_path

    html = get_swagger_ui_html(openapi_url=app.openapi_url, title=f"{app.title} - docs",
                               swagger_js_url=f"{DOCS_ASSETS}/swagger-ui-bundle.js",
                               swagger_css_url=f"{DOCS_ASSETS}/swagger-ui.css",
                               swagger_favicon_url=f"{DOCS_ASSETS}/favicon-32x32.png").body.decode()
    headers = _docs_headers(html)

    @app.get("/docs", include_in_schema=False)
    def docs() -> HTMLResponse:
        return HTMLResponse(html, headers=headers)

    app.mount(DOCS_ASSETS, StaticFiles(directory=swagger_ui_path), name="docs-assets")
