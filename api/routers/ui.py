"""The analysts' web page: static files from api/static/ at /ui, and / redirecting there.

Plain HTML, CSS and JavaScript modules: nothing to build, nothing fetched from
elsewhere. The page calls the same /v1 API with the key the analyst types (kept
in the tab's sessionStorage); it gets no privilege of its own. A strict
Content-Security-Policy keeps scripts to this origin's files, so text from a
PDF can never run as code even if it were inserted as HTML by mistake.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, FastAPI
from fastapi.responses import RedirectResponse
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


@router.get("/")
def root() -> RedirectResponse:
    return RedirectResponse("/ui/", status_code=307)


@router.get("/ui")
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
