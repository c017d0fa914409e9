"""The analysts' web page (/ui), end to end: headless Chromium (Debian's chromium
+ chromium-driver, driven by Selenium) against a real `evidentia serve`.

The browser tests skip cleanly where Chromium, its driver or selenium is
missing (.ci/run installs them). With EVIDENTIA_UI_SCREENSHOTS=docs the session
test saves ui-results.png, ui-page-view.png, ui-fallback.png and ui-indexing.png there (the README's screenshots).

The highlight tests at the end need no browser.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pymupdf
import pytest

from evidentia.api.highlight import MAX_MARKS, highlight_terms, mark_page
from evidentia.samples import SAMPLE_ANSWER, SAMPLE_QUESTION, write_sample_report
from tests.utils.server import Server, evidentia_exe

pytestmark = pytest.mark.slow  # a headless browser and a real server

CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser")
CHROMEDRIVER_CANDIDATES = ("/usr/bin/chromedriver", "/usr/lib/chromium/chromedriver")
CHROME_FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--disable-extensions", "--disable-default-apps", "--window-size=1360,1000")
WAIT_S = 30


def _first(paths: tuple[str, ...], name: str) -> str | None:
    for p in paths:
        if os.access(p, os.X_OK):
            return p
    return shutil.which(name)


def closed_port() -> int:
    """A loopback port with nothing listening (bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- fixtures -------------------------------------------------------------------
@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install -e '.[test]')")
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    chromium = _first(CHROMIUM_CANDIDATES, "chromium")
    driver_path = _first(CHROMEDRIVER_CANDIDATES, "chromedriver")
    if not chromium or not driver_path:
        pytest.skip("no Chromium here (apt-get install chromium chromium-driver); .ci/run installs it")
    options = Options()
    options.binary_location = chromium
    for flag in CHROME_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # to catch script errors and CSP violations
    log = tmp_path_factory.mktemp("chromedriver") / "chromedriver.log"
    try:
        driver = webdriver.Chrome(service=Service(executable_path=driver_path, log_output=str(log)), options=options)
    except Exception as exc:  # a broken install: say why rather than erroring every test
        pytest.skip(f"Chromium did not start: {str(exc).splitlines()[0]}")
    driver.set_page_load_timeout(WAIT_S)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """`evidentia serve` with the `none` reranker by default, no dense embeddings
    (fast), and an LLM endpoint on a port where nothing listens."""
    home = tmp_path_factory.mktemp("ui-server")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EVIDENTIA_", "OPENAI_"))}
    env.update(EVIDENTIA_DATA_DIR=str(home / "data"), EVIDENTIA_BACKEND="embedded", EVIDENTIA_DEFAULT_RERANKER="none",
               EVIDENTIA_DENSE="off", EVIDENTIA_LLM_BASE_URL=f"http://127.0.0.1:{closed_port()}/v1",
               EVIDENTIA_LLM_API_KEY="dummy-key", EVIDENTIA_LLM_MAX_RETRIES="0", EVIDENTIA_LLM_TIMEOUT_S="5")
    key = subprocess.run([evidentia_exe(), "keys", "create", "--tenant", "acme"], env=env, check=True,
                         capture_output=True, text=True).stdout.strip()
    srv = Server(env, home / "server.log")
    try:
        srv.wait_ready()
        srv.key = key
        srv.home = home
        yield srv
    finally:
        srv.stop()


# -- helpers ----------------------------------------------------------------------
def wait(driver, condition, message: str, timeout: float = WAIT_S):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.1).until(condition, message)


def by_css(driver, selector: str):
    from selenium.webdriver.common.by import By

    return driver.find_element(By.CSS_SELECTOR, selector)


def visible(selector: str):
    def check(driver):
        from selenium.webdriver.common.by import By

        found = driver.find_elements(By.CSS_SELECTOR, selector)
        return found[0] if found and found[0].is_displayed() else False

    return check


def banner_text(driver) -> str:
    banner = by_css(driver, "#banner")
    return banner.text if banner.is_displayed() else ""


def wait_banner(driver, needle: str) -> str:
    return wait(driver, lambda d: needle.lower() in banner_text(d).lower() and banner_text(d),
                f"no error banner containing {needle!r}")


def sign_in(driver, url: str, key: str, analyst: str = "") -> None:
    driver.get(url + "/")
    driver.execute_script("sessionStorage.clear()")  # a fresh tab: signed out
    driver.refresh()
    field = wait(driver, visible("#api-key"), "no sign-in form")
    field.clear()
    field.send_keys(key)
    by_css(driver, "#analyst").clear()
    if analyst:
        by_css(driver, "#analyst").send_keys(analyst)
    by_css(driver, "#login-button").click()


def fill(driver, selector: str, text: str) -> None:
    el = by_css(driver, selector)
    el.clear()
    if text:
        el.send_keys(text)


def doc_checkbox(driver, document_id: str):
    return by_css(driver, f'#doc-list li[data-document-id="{document_id}"] input[type=checkbox]')


def wait_document_ready(driver, document_id: str) -> None:
    wait(driver, lambda d: d.find_elements("css selector", f'#doc-list li[data-document-id="{document_id}"]'
                                           f'[data-status="ready"]'), f"{document_id} never shown ready")


def assert_no_script_errors(driver) -> None:
    """The console holds nothing but the HTTP errors the test provoked on purpose
    (no exception, no Content-Security-Policy violation)."""
    problems = [e["message"] for e in driver.get_log("browser")
                if e["level"] in ("SEVERE", "WARNING") and "Failed to load resource" not in e["message"]]
    assert not problems, problems


def api_upload_ready(server, path: Path, document_id: str) -> None:
    headers = {"X-API-Key": server.key}
    with httpx.Client(base_url=server.url, headers=headers, timeout=30) as c:
        r = c.post("/v1/documents", data={"document_id": document_id},
                   files={"file": (path.name, path.read_bytes(), "application/pdf")})
        assert r.status_code == 202, r.text
        deadline = time.monotonic() + WAIT_S
        while (doc := c.get(f"/v1/documents/{document_id}").json())["status"] not in ("ready", "failed"):
            assert time.monotonic() < deadline, doc
            time.sleep(0.05)
        assert doc["status"] == "ready", doc


# -- browser tests ------------------------------------------------------------------
def test_root_redirects_to_the_page_and_api_404s_stay_json(server):
    r = httpx.get(server.url + "/", follow_redirects=False)
    assert r.status_code == 307 and r.headers["location"] == "/ui/"
    for path in ("/", "/ui"):  # curl -I
        r = httpx.head(server.url + path, follow_redirects=False)
        assert r.status_code == 307 and r.headers["location"] == "/ui/", (path, r.status_code)
    assert httpx.head(server.url + "/", follow_redirects=True).status_code == 200
    page = httpx.get(server.url + "/", follow_redirects=True)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert '<script type="module" src="app.js">' in page.text
    for path in ("/v1/nope", "/ui/nope.js"):
        r = httpx.get(server.url + path)
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found", r.text
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}
    assert "/" not in httpx.get(server.url + "/openapi.json").json()["paths"]


def test_analyst_session_upload_validate_feedback(browser, server, tmp_path):
    driver = browser
    # a wrong key is refused with the API's message; the key is never stored
    sign_in(driver, server.url, "evk_not-a-real-key")
    assert "not accepted" in wait_banner(driver, "invalid API key")
    assert driver.execute_script("return sessionStorage.getItem('evidentia.apiKey')") is None

    sign_in(driver, server.url, server.key, analyst="ann@example.com")
    wait(driver, visible("#workspace"), "not signed in")
    assert "ann@example.com" in by_css(driver, "#session-label").text
    assert not by_css(driver, "#banner").is_displayed()
    assert driver.execute_script("return sessionStorage.getItem('evidentia.apiKey')") == server.key
    assert driver.execute_script("return localStorage.length") == 0

    # upload through the file input; the status is polled until ready (and it gets ticked)
    pdf = write_sample_report(tmp_path / "acme-2023.pdf")
    by_css(driver, "#file-input").send_keys(str(pdf))
    wait_document_ready(driver, "acme-2023")
    assert "6 pages" in by_css(driver, '#doc-list li[data-document-id="acme-2023"]').text
    box = doc_checkbox(driver, "acme-2023")
    if not box.is_selected():
        box.click()
    assert box.is_selected()

    # empty question: a clear message, no request
    fill(driver, "#question", "")
    fill(driver, "#answer", SAMPLE_ANSWER)
    by_css(driver, "#validate-button").click()
    wait_banner(driver, "Type the question")
    assert not by_css(driver, "#results").is_displayed()

    fill(driver, "#question", SAMPLE_QUESTION)
    # a limit of the server's, in the form's words ("body.top_k: at most 100 …" before)
    fill(driver, "#top-k", "500")
    by_css(driver, "#validate-button").click()
    assert wait_banner(driver, "Candidate pages: at most 100").startswith("Candidate pages: at most 100")
    fill(driver, "#top-k", "")
    by_css(driver, "#validate-button").click()
    first = wait(driver, visible("#result-list li.result"), "no result")
    assert not by_css(driver, "#banner").is_displayed()
    assert first.get_attribute("data-document-id") == "acme-2023" and first.get_attribute("data-page") == "2"
    assert "page 2" in first.text and "BM25 score" in first.text
    # what the score is, said once above the cards (the stage here is bm25: dense is off)
    assert "BM25 score: how strongly the page holds" in by_css(driver, "#score-help").text
    assert "not a probability" in by_css(driver, "#score-help").text
    # the server's defaults, and the LLM it has an endpoint key for, are offered
    assert by_css(driver, "#top-k").get_attribute("placeholder") == "default 20"
    llm = by_css(driver, '#reranker option[value="llm"]')
    assert llm.is_enabled() and llm.text == "LLM"
    marks = [m.text for m in first.find_elements("css selector", ".snippet mark")]
    assert marks and "12,450" in marks, marks
    # the thumbnail is a real PNG, fetched with the key (blob: URL) and decoded
    wait(driver, lambda d: d.execute_script(
        "const i = document.querySelector('#result-list li.result .thumb-img');"
        "return i && i.complete && i.naturalWidth > 0 && i.src.startsWith('blob:')"), "thumbnail not loaded")
    assert not by_css(driver, "#fallback").is_displayed()

    shots = os.environ.get("EVIDENTIA_UI_SCREENSHOTS")

    # the larger view: a bigger rendering and the page's text, keywords marked
    first.find_element("css selector", ".thumb").click()
    wait(driver, visible("#viewer"), "the larger view did not open")
    wait(driver, lambda d: d.execute_script(
        "const i = document.getElementById('viewer-img'); return i.complete && i.naturalWidth >= 1000"),
        "no large image")
    wait(driver, lambda d: d.find_elements("css selector", "#viewer-text mark"), "no marked text in the view")
    assert "Greenhouse gas emissions" in by_css(driver, "#viewer-text").text
    if shots:
        driver.save_screenshot(str(Path(shots) / "ui-page-view.png"))

    # a verdict given in the larger view is the card's: acknowledged in both, and in the export
    by_css(driver, "#viewer-verdict .verdict-yes").click()
    wait(driver, lambda d: "Recorded: relevant" in by_css(d, "#viewer-verdict .verdict-status").text,
         "feedback not shown as recorded in the view")
    by_css(driver, "#viewer-close").click()
    wait(driver, lambda d: not by_css(d, "#viewer").is_displayed(), "the view did not close")
    assert not driver.find_elements("css selector", "#viewer-verdict button")
    assert "Recorded: relevant" in first.find_element("css selector", ".verdict-status").text
    assert first.find_element("css selector", ".verdict-yes").get_attribute("aria-pressed") == "true"
    if shots:
        wait(driver, lambda d: d.execute_script(
            "return [...document.querySelectorAll('.thumb-img')].every(i => i.complete && i.naturalWidth > 0)"),
            "thumbnails not all loaded")
        driver.save_screenshot(str(Path(shots) / "ui-results.png"))
    lines = httpx.get(server.url + "/v1/feedback/export", headers={"X-API-Key": server.key}).text.splitlines()
    records = [json.loads(line) for line in lines]
    assert {"question": SAMPLE_QUESTION, "answer": SAMPLE_ANSWER, "relevance": 1, "doc_id": "acme-2023",
            "page": 2, "source": "feedback"}.items() <= records[-1].items(), records

    # asked again, the page says what was said of it before; the others say nothing
    by_css(driver, "#validate-button").click()
    wait(driver, lambda d: d.execute_script(
        "const c = document.querySelector('#result-list li.result .verdict-earlier');"
        "return c && !c.hidden && c.textContent"), "no earlier verdict shown")
    again = by_css(driver, "#result-list li.result")
    assert again.get_attribute("data-page") == "2"
    assert "Judged before for this question: relevant (ann@example.com," in again.text
    assert again.find_element("css selector", ".verdict-yes").get_attribute("aria-pressed") == "false"
    others = driver.find_elements("css selector", "#result-list li.result + li.result .verdict-earlier")
    assert others and all(not e.is_displayed() for e in others)

    # the larger view reads on through the document, and a verdict can be given on any page of
    # it (the evidence an analyst finds by reading further was out of reach)
    from selenium.webdriver.common.keys import Keys

    again.find_element("css selector", ".thumb").click()
    wait(driver, visible("#viewer"), "the larger view did not open")
    assert by_css(driver, "#viewer-prev").is_enabled() and by_css(driver, "#viewer-next").is_enabled()
    by_css(driver, "#viewer-next").click()
    wait(driver, lambda d: by_css(d, "#viewer-title").text.startswith("acme-2023 · page 3"), "no next page")
    wait(driver, lambda d: d.execute_script(
        "const i = document.getElementById('viewer-img'); return i.complete && i.naturalWidth >= 1000"),
        "no image of the next page")
    by_css(driver, "#viewer-verdict .verdict-no").click()
    wait(driver, lambda d: "Recorded: not relevant" in by_css(d, "#viewer-verdict .verdict-status").text,
         "the next page's verdict not recorded")
    by_css(driver, "#viewer").send_keys(Keys.ARROW_LEFT)  # the arrow keys turn the pages too
    wait(driver, lambda d: by_css(d, "#viewer-title").text.startswith("acme-2023 · page 2"), "no previous page")
    assert "Recorded" not in by_css(driver, "#viewer-verdict").text  # page 2's own verdict, none yet here
    by_css(driver, "#viewer-close").click()
    records = [json.loads(line) for line in httpx.get(
        server.url + "/v1/feedback/export", headers={"X-API-Key": server.key}).text.splitlines()]
    assert (records[-1]["page"], records[-1]["relevance"]) == (3, 0), records[-1]

    # a question asked without an answer is searched too (the API and the CLI take it)
    fill(driver, "#answer", "")
    by_css(driver, "#validate-button").click()
    wait(driver, lambda d: d.execute_script(
        "return document.querySelectorAll('#result-list li.result').length > 0 && "
        "!document.querySelector('#result-list li.result .verdict-status').textContent"), "no question-only result")
    assert not by_css(driver, "#banner").is_displayed()

    # a form error clears the earlier question's results: under the error they would read as this one's
    fill(driver, "#question", "")
    by_css(driver, "#validate-button").click()
    wait_banner(driver, "Type the question")
    assert not by_css(driver, "#results").is_displayed()
    assert not driver.find_elements("css selector", "#result-list li.result")

    # the key survives a reload (same tab), and logging out forgets it
    driver.refresh()
    wait(driver, visible("#workspace"), "signed out by a reload")
    by_css(driver, "#logout").click()
    wait(driver, visible("#login"), "not signed out")
    assert driver.execute_script("return sessionStorage.getItem('evidentia.apiKey')") is None
    assert_no_script_errors(driver)


def test_llm_unavailable_shows_the_bm25_fallback(browser, server, tmp_path):
    api_upload_ready(server, write_sample_report(tmp_path / "r.pdf"), "llm-doc")
    driver = browser
    sign_in(driver, server.url, server.key)
    wait_document_ready(driver, "llm-doc")
    box = doc_checkbox(driver, "llm-doc")
    if not box.is_selected():
        box.click()
    fill(driver, "#question", SAMPLE_QUESTION)
    fill(driver, "#answer", SAMPLE_ANSWER)
    from selenium.webdriver.support.ui import Select

    # the file's name shown where the id differs from it (an id chosen at upload here)
    assert by_css(driver, '#doc-list li[data-document-id="llm-doc"] .doc-file').text == "r.pdf"
    assert not driver.find_elements("css selector", '#doc-list li[data-document-id="acme-2023"] .doc-file')
    Select(by_css(driver, "#reranker")).select_by_value("llm")
    by_css(driver, "#validate-button").click()
    notice = wait(driver, visible("#fallback"), "no fallback notice")
    # plain words, the order actually shown, and no technical detail cut mid-word
    assert "LLM reranker could not rank" in notice.text and "BM25 order" in notice.text
    assert "…" not in notice.text and "could not be reached" in notice.text
    wait(driver, visible("#result-list li.result"), "no result in BM25 order")
    assert "ranked by bm25" in by_css(driver, "#results-summary").text
    assert "BM25 score" in by_css(driver, "#result-list li.result").text  # not an "LLM rank score"
    shots = os.environ.get("EVIDENTIA_UI_SCREENSHOTS")
    if shots:
        driver.save_screenshot(str(Path(shots) / "ui-fallback.png"))
    assert not by_css(driver, "#banner").is_displayed()
    assert_no_script_errors(driver)


def test_the_page_counts_pages_while_a_document_is_indexed(browser, tmp_path):
    """With page embeddings on, a long upload shows "indexing N / M pages" while it runs;
    a document indexed without them (the CLI with EVIDENTIA_DENSE=off) is searched with
    BM25, and the page says why, as the API's `stage_note` does."""
    from evidentia.samples import write_pdf

    home = tmp_path / "dense-server"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EVIDENTIA_", "OPENAI_"))}
    env.update(EVIDENTIA_DATA_DIR=str(home / "data"), EVIDENTIA_DENSE="on", EVIDENTIA_DENSE_BATCH_SIZE="8")
    key = subprocess.run([evidentia_exe(), "keys", "create", "--tenant", "acme"], env=env, check=True,
                         capture_output=True, text=True).stdout.strip()
    subprocess.run([evidentia_exe(), "index", "--tenant", "acme", str(write_sample_report(tmp_path / "plain.pdf"))],
                   env={**env, "EVIDENTIA_DENSE": "off"}, check=True, capture_output=True)
    home.mkdir(exist_ok=True)
    srv = Server(env, home / "server.log")
    try:
        srv.wait_ready()
        pages = [f"Page {i}: " + " ".join(["Scope 1 emissions, water withdrawal and waste recycling."] * 40)
                 for i in range(400)]
        pdf = write_pdf(tmp_path / "long-report.pdf", pages)
        with httpx.Client(base_url=srv.url, headers={"X-API-Key": key}, timeout=30) as c:
            assert c.post("/v1/documents", files={"file": (pdf.name, pdf.read_bytes(), "application/pdf")}
                          ).status_code == 202
        driver = browser
        sign_in(driver, srv.url, key)
        # no LLM endpoint key on this server: the form says so rather than fall back on every search
        wait(driver, lambda d: "not configured" in by_css(d, '#reranker option[value="llm"]').text,
             "the LLM offered without an endpoint")
        assert not by_css(driver, '#reranker option[value="llm"]').is_enabled()
        info = '#doc-list li[data-document-id="long-report"] .doc-info'
        counted = re.compile(r"indexing [1-9][0-9]* / 400 pages")
        # read in one script call: the list is re-rendered every second, so elements go stale
        wait(driver, lambda d: counted.search(d.execute_script(
            f"return [...document.querySelectorAll('{info}')].map(e => e.textContent).join(' ')") or ""),
             "no page count while indexing", timeout=120)
        shots = os.environ.get("EVIDENTIA_UI_SCREENSHOTS")
        if shots:
            driver.save_screenshot(str(Path(shots) / "ui-indexing.png"))
        wait_document_ready(driver, "plain")
        doc_checkbox(driver, "plain").click()
        fill(driver, "#question", SAMPLE_QUESTION)
        fill(driver, "#answer", SAMPLE_ANSWER)
        by_css(driver, "#validate-button").click()
        note = wait(driver, visible("#stage-note"), "no stage note for a document without page embeddings")
        assert "searched with bm25" in note.text and "plain" in note.text
        assert "ranked by bm25" in by_css(driver, "#results-summary").text
        assert_no_script_errors(driver)
    finally:
        srv.stop()


def test_failed_upload_and_document_not_ready_are_explained(browser, server, tmp_path):
    driver = browser
    sign_in(driver, server.url, server.key)
    wait(driver, visible("#workspace"), "not signed in")
    for box in driver.find_elements("css selector", "#doc-list input[type=checkbox]"):
        if box.is_selected():
            box.click()
    bad = tmp_path / "broken.pdf"
    bad.write_bytes(b"%PDF-1.7\nthis is not really a PDF\n")
    by_css(driver, "#file-input").send_keys(str(bad))
    # polled until it fails; the reason is shown and it cannot be ticked
    failed = wait(driver, lambda d: d.find_elements("css selector", '#doc-list li[data-document-id="broken"]'
                                                    '[data-status="failed"]'), "broken.pdf not shown as failed")[0]
    box = failed.find_element("css selector", "input")
    assert not box.is_enabled()
    assert failed.find_element("css selector", ".doc-info").text.strip()
    fill(driver, "#question", SAMPLE_QUESTION)
    fill(driver, "#answer", SAMPLE_ANSWER)
    by_css(driver, "#validate-button").click()
    wait_banner(driver, "Select at least one ready document")
    # forced through anyway (as a stale page would): the server's 409, in words
    driver.execute_script("arguments[0].disabled = false; arguments[0].click()", box)
    by_css(driver, "#validate-button").click()
    assert "upload it again" in wait_banner(driver, "broken failed to index")
    # a non-PDF is refused at upload with the API's message
    text = tmp_path / "notes.pdf"
    text.write_text("just some notes")
    by_css(driver, "#file-input").send_keys(str(text))
    assert "notes.pdf" in wait_banner(driver, "not a PDF")
    assert_no_script_errors(driver)


def test_the_api_docs_render_with_nothing_from_elsewhere(browser, server):
    """/docs is Swagger UI from this server's own files (FastAPI's loads a CDN: a blank page
    on a network without the internet, which this test's browser is), under a CSP that
    allows only them and the page's one inline script."""
    driver = browser
    driver.get(server.url + "/docs")
    title = wait(driver, visible(".swagger-ui .info .title"), "Swagger UI did not render /docs")
    assert "Evidentia validation API" in title.text
    wait(driver, lambda d: d.find_elements("css selector", ".opblock-summary-path"), "no operation listed")
    paths = {e.get_attribute("data-path") for e in driver.find_elements("css selector", ".opblock-summary-path")}
    assert "/v1/validate" in paths and "/v1/feedback" in paths
    loaded = driver.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
    assert loaded and all(url.startswith(server.url) for url in loaded), loaded
    assert_no_script_errors(driver)


def test_keywords_module_in_the_browser(browser, server):
    driver = browser
    driver.get(server.url + "/ui/")
    result = driver.execute_async_script("""
        const done = arguments[0];
        import('/ui/keywords.js').then((m) => {
          const bullets = document.createElement('p');
          m.appendHighlighted(bullets, "\uF0B7 A short-term target \uF0A7 and a medium-term one", []);
          const terms = m.keywords("What were the Scope 1 and 2 emissions in 2023? $1,577.00 tCO2e, 12.5 %");
          const p = document.createElement('p');
          const n = m.appendHighlighted(p, "<b>Emission</b> total 1577 t; 2023: 12.5% <img src=x onerror=alert(1)>", terms);
          const reflowed = m.reflowed("Sustainability Committee\\nThe Committee assists the Board in overseeing\\n" +
            "the Group's HSEC performance, and the adequacy of its sustain-\\nability framework.\\n" +
            "Scope 1 emissions in 2023 (tCO2e) were 12,450\\nScope 2 emissions\\n• a bullet");
          const folded = document.createElement('p');
          const nl = m.keywords("Hoeveel procent van de verpakkingen is recyclebaar? " +
                                "Qual é a percentagem de mulheres?");
          m.appendHighlighted(folded, "Écart salarial : 4 %, 48.300 Tonnen, 12 450 tCO2e, Scope 1 450",
                              m.keywords("ecart salarial 48,300 t 12,450 450"));
          done({terms, n, html: p.innerHTML, marks: [...p.querySelectorAll('mark')].map((x) => x.textContent),
                eu: m.canonicalNumber("1.577,00"), bullets: bullets.textContent, reflowed, nl,
                folded: [...folded.querySelectorAll('mark')].map((x) => x.textContent)});
        }).catch((e) => done({error: String(e)}));
    """)
    assert "error" not in result, result
    assert result["terms"] == ["scope", "emissions", "2023", "1577", "tco2e", "12.5"]
    assert result["marks"] == ["Emission", "1577", "2023", "12.5"]
    assert "<img" not in result["html"] and "&lt;img" in result["html"]  # text, never HTML
    assert result["eu"] == "1577"
    # a Symbol font's bullet (private use, a missing-glyph box) shown as a bullet
    assert result["bullets"] == "• A short-term target • and a medium-term one"
    # Dutch and Portuguese stop words are not marked; a word typed without its accents marks it
    assert result["nl"] == ["procent", "verpakkingen", "recyclebaar", "percentagem", "mulheres"]
    # a French figure grouped by a space is one mark; an English "1 450" marks for either group
    assert result["folded"] == ["Écart", "salarial", "48.300", "12 450", "1 450"]
    # the PDF's line ends inside a sentence read as spaces; headings, a row ending in a figure, bullets kept
    assert result["reflowed"].split("\n") == [
        "Sustainability Committee",
        "The Committee assists the Board in overseeing the Group's HSEC performance, and the adequacy of its "
        "sustain-ability framework.",
        "Scope 1 emissions in 2023 (tCO2e) were 12,450", "Scope 2 emissions", "• a bullet"]
    assert_no_script_errors(driver)


def test_a_document_line_says_how_far_indexing_has_gone(browser, server):
    """The states GET /v1/documents/{id} goes through, as the list shows them: a scan's
    OCR (seconds a page) with what it has still to read, then the pages embedded."""
    driver = browser
    driver.get(server.url + "/ui/")
    lines = driver.execute_async_script("""
        const done = arguments[0];
        const progress = (pages_done, pages_total, ocr_pages, ocr_pages_left) =>
          ({status: "indexing", progress: {pages_done, pages_total, ocr_pages, ocr_pages_left}});
        import('/ui/status.js').then((m) => done([
          {status: "queued", progress: null},
          progress(0, 40, 0, 40), progress(0, 40, 12, 27), progress(0, 40, 38, 0), progress(25, 40, 38, 0),
          progress(120, 300, 0, null), {status: "indexing", progress: null},
          {status: "ready", pages: 40, ocr_pages: 38, ocr_confidence: 91.4, unread_pages: 1, empty_pages: 2},
        ].map(m.documentStatus))).catch((e) => done([String(e)]));
    """)
    assert lines == ["waiting to be indexed…",
                     "reading scans by OCR: 40 to go (40 pages)…",
                     "reading scans by OCR: 12 read, 27 to go (40 pages)…",
                     "indexing 0 / 40 pages…", "indexing 25 / 40 pages…", "indexing 120 / 300 pages…",
                     "indexing…",
                     "40 pages, 38 read by OCR (confidence 91%), 1 scanned page not read, 1 without text"]
    assert_no_script_errors(driver)


# -- server-side marks on the page image (no browser) ------------------------------
def test_highlight_terms_are_normalised_and_bounded():
    assert highlight_terms("Scope emissions 12,450 $1577.00 a 2023 2023") == ["scope", "emissions", "12450", "1577",
                                                                             "2023"]
    assert len(highlight_terms(" ".join(f"w{i}" for i in range(100)))) == 32
    assert highlight_terms(None) == [] and highlight_terms("") == []


def one_line_page(tmp_path: Path, text: str) -> Path:
    """A PDF of one page holding ``text``."""
    pdf = tmp_path / "line.pdf"
    doc = pymupdf.open()
    doc.new_page().insert_text((72, 72), text, fontname="helv")
    doc.save(pdf)
    return pdf


def test_a_figure_with_a_currency_prefix_marks_the_figure_only(tmp_path):
    assert highlight_terms("US$100 EUR 12,450") == ["100", "eur", "12450"]
    with pymupdf.open(one_line_page(tmp_path, "Fine of US$100 paid; bonds of US$250 and US$900 issued.")) as doc:
        assert mark_page(doc.load_page(0), highlight_terms("US$100")) == 1  # "US$100", not the other amounts


def test_a_word_typed_without_its_accents_marks_it(tmp_path):
    """Search found "écart" for "ecart" (its analysers fold accents); the marks did not."""
    with pymupdf.open(one_line_page(tmp_path, "Écart salarial entre femmes et hommes : 4 %.")) as doc:
        assert mark_page(doc.load_page(0), highlight_terms("ecart salarial")) == 2
        assert mark_page(doc.load_page(0), highlight_terms("écart")) == 1


def test_a_continental_figure_is_marked_for_its_english_writing(tmp_path):
    with pymupdf.open(one_line_page(tmp_path, "Direkte Emissionen: 48.300 Tonnen CO2e, 12,5 % weniger.")) as doc:
        assert mark_page(doc.load_page(0), highlight_terms("48,300 t")) == 1
        assert mark_page(doc.load_page(0), highlight_terms("48.3")) == 1  # an English reading of it still marks it


def test_mark_page_marks_matching_words_only(tmp_path):
    pdf = write_sample_report(tmp_path / "r.pdf")
    with pymupdf.open(pdf) as doc:
        page = doc.load_page(1)
        assert mark_page(page, highlight_terms("emission 12450 2023")) >= 4  # emissions x2, 12,450, 2023
        annots = list(page.annots())
        assert len(annots) == 1 and annots[0].type[1] == "Highlight"
        assert mark_page(doc.load_page(2), ["nothing-like-this"]) == 0
        assert mark_page(doc.load_page(3), ["emission"]) == 0  # the blank page
        many = doc.load_page(1)
        assert mark_page(many, [chr(c) * 2 for c in range(97, 123)]) <= MAX_MARKS


def test_png_highlight_param(server, tmp_path):
    api_upload_ready(server, write_sample_report(tmp_path / "h.pdf"), "hl-doc")
    h = {"X-API-Key": server.key}
    base = f"{server.url}/v1/documents/hl-doc/pages/2.png?width=300"
    plain = httpx.get(base, headers=h)
    marked = httpx.get(base + "&highlight=emissions+12450", headers=h)
    assert plain.status_code == marked.status_code == 200
    assert marked.headers["content-type"] == "image/png" and marked.content != plain.content
    # the stored PDF is untouched: a plain rendering is the same as before
    assert httpx.get(base, headers=h).content == plain.content
    too_long = httpx.get(base + "&highlight=" + "x" * 501, headers=h)
    assert too_long.status_code == 422 and too_long.json()["error"]["code"] == "validation_error"
    assert httpx.get(base + "&highlight=x").status_code == 401
