"""The notebooks in a real browser: JupyterLab in headless Chromium, driven as a user would.

The other notebook tests execute cells headless (nbmake) and drive widgets through their
Python API; neither shows whether JupyterLab draws a widget or a chart, or whether a click
on a widget's button does what the learner expects. Here ``jupyter lab`` serves temporary
copies of the notebooks (the committed ones are never written), Chromium runs every cell
from the Run menu, changes a dropdown and presses buttons, and the test reads the page:
widget views (not their text repr), charts drawn as SVG, one result per widget, and no
JavaScript errors in the console. Screenshots go to ``$BROWSER_ARTIFACTS`` (default
``tests/artifacts/browser``, ignored by git).

Needs Playwright for Python (the ``dev`` extra) and Debian's ``chromium`` (``.ci/run``
installs it with apt); Playwright's own browser download is not used. Without either the
tests skip and say which is missing. Each test that runs a whole notebook is marked
``runs_notebook``, so nbmake does not run that notebook again (``tests/conftest.py``);
where these tests skip, nothing is collected from this file and nbmake runs it.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("jupyterlab", reason="the notebook extra (jupyterlab) is not installed")
sync_api = pytest.importorskip(
    "playwright.sync_api", reason="Playwright for Python is not installed (pip install playwright, "
    "part of the dev extra)")

pytestmark = [pytest.mark.browser, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
if CHROMIUM is None:
    pytest.skip("no chromium on PATH: install Debian's chromium (apt-get install chromium; "
                ".ci/run does) to run the browser tests", allow_module_level=True)
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SERVER_START_S = 90
RUN_ALL_S = 240
WIDGET_RUN_S = 120
# Text where a widget or a chart was not drawn: a widget's text repr, a panel's plain-text
# and static HTML stand-ins, ipywidgets' failure message, JupyterLab's refusal of an SVG.
NOT_DRAWN = ("VBox(children=", "(a widget: run the notebook to use it)",
             "a static copy of the widget's output", "Error displaying widget",
             "Cannot display an untrusted SVG")
# Both forms a chart takes in JupyterLab: the project's "static" altair renderer gives
# image/svg+xml (drawn as an <img>), altair's "jupyter" renderer a vega-embed svg or canvas.
CHARTS = ".jp-RenderedSVG img, .vega-embed svg, .vega-embed canvas"


def artifacts() -> Path:
    folder = Path(os.environ.get("BROWSER_ARTIFACTS") or ROOT / "tests" / "artifacts" / "browser")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A ``jupyter lab`` on 127.0.0.1 with a random token, serving copies of the notebooks.

    Its settings, workspaces, runtime files and the learner's exercise progress all live in
    a temporary folder, so the run neither reads nor writes the user's. Yields the base URL
    and the token; the finalizer stops the server and its kernels.
    """
    home = tmp_path_factory.mktemp("lab")
    served = home / "notebooks"
    served.mkdir()
    for name in ("01_gemm_ladder.ipynb", "10_roofline.ipynb", "90_interview_prep.ipynb"):
        shutil.copy(NOTEBOOKS / name, served / name)
    # The JupyterLab settings the project ships (binder/overrides.json), as Binder and the
    # Makefile's venv install them: JupyterLab's own app settings.
    (home / "app-settings").mkdir()
    shutil.copy(ROOT / "binder" / "overrides.json", home / "app-settings" / "overrides.json")
    # JupyterLab asks whether to fetch Jupyter news (a toast over the screenshots, and a
    # "yes" would go to the network), and asks for a kernel when the kernel list comes late
    # (a busy machine): answered here as a user's settings would answer them. Every cell is
    # laid out (windowing off): a reopened notebook otherwise draws a cell's outputs only
    # once it is scrolled to, late on a busy machine (a CI run timed out waiting for one).
    for plugin, values in (("apputils-extension/notification", {"fetchNews": "false"}),
                           ("notebook-extension/tracker", {"autoStartDefaultKernel": True,
                                                           "windowingMode": "none"})):
        file = home / "settings" / "@jupyterlab" / f"{plugin}.jupyterlab-settings"
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text(json.dumps(values))
    token = secrets.token_hex(16)
    env = {**os.environ, "KERNELS_BACKEND": "interpreter",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "JUPYTER_RUNTIME_DIR": str(home / "runtime"), "JUPYTER_CONFIG_DIR": str(home / "config"),
           "JUPYTER_DATA_DIR": str(home / "data"),   # its own notebook-signature store (trust)
           "JUPYTERLAB_SETTINGS_DIR": str(home / "settings"),
           "JUPYTERLAB_WORKSPACES_DIR": str(home / "workspaces"),
           "IPYTHONDIR": str(home / "ipython"),
           "WORKBENCH_PROGRESS": str(home / "progress.json")}
    command = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", "--port=0",
               f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={served}",
               f"--LabApp.app_settings_dir={home / 'app-settings'}"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        command.append("--ServerApp.allow_root=True")
    log = (home / "server.log").open("w")
    server = subprocess.Popen(command, env=env, cwd=served, stdout=log, stderr=subprocess.STDOUT,
                              start_new_session=True)
    try:
        yield _wait_ready(server, token, home / "runtime", home / "server.log"), token
    finally:
        _stop(server)
        log.close()


def _wait_ready(server: subprocess.Popen, token: str, runtime: Path, log: Path) -> str:
    """The server's URL once it answers; the port it bound is in its runtime file."""
    deadline = time.monotonic() + SERVER_START_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"jupyter lab exited with {server.returncode}:\n{log.read_text()[-3000:]}")
        for info in runtime.glob("jpserver-*.json"):
            url = json.loads(info.read_text())["url"].rstrip("/")
            try:
                with urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=5) as reply:
                    if reply.status == 200:
                        return url
            except OSError:
                pass
        time.sleep(0.5)
    pytest.fail(f"jupyter lab did not answer within {SERVER_START_S} s:\n{log.read_text()[-3000:]}")


def _stop(server: subprocess.Popen) -> None:
    """SIGTERM to the server's process group (it shuts its kernels down); SIGKILL if it lingers."""
    for sig, wait_s in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
        try:
            os.killpg(server.pid, sig)
        except ProcessLookupError:
            return
        try:
            server.wait(wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


@pytest.fixture(scope="module")
def chromium():
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True,
                                             args=CHROMIUM_ARGS)
        yield browser
        browser.close()


class Page:
    """A browser tab on one notebook that records every JavaScript error it sees."""

    def __init__(self, chromium, lab, notebook: str):
        url, token = lab
        self.name = Path(notebook).stem
        self.context = chromium.new_context(viewport={"width": 1400, "height": 2200})
        self.page = self.context.new_page()
        self.errors: list[str] = []
        # No console error is allowed: a clean JupyterLab 4 with ipywidgets 8 logs none.
        self.page.on("console", self._console)
        self.page.on("pageerror", lambda error: self.errors.append(f"uncaught: {error}"))
        self.cells = json.loads((NOTEBOOKS / notebook).read_text())["cells"]
        self.page.goto(f"{url}/lab/tree/{notebook}?token={token}&reset")
        self.wait_loaded()

    def wait_loaded(self) -> None:
        """Every cell drawn (a large notebook draws in steps) and the kernel idle."""
        sync_api.expect(self.page.locator(".jp-Notebook .jp-Cell")).to_have_count(
            len(self.cells), timeout=SERVER_START_S * 1000)
        sync_api.expect(self.page.locator(".jp-StatusBar-Widget", has_text="| Idle")).to_have_count(
            1, timeout=SERVER_START_S * 1000)

    def _console(self, message) -> None:
        if message.type == "error":
            self.errors.append(f"console: {message.text} ({message.location.get('url', '')})")

    def command(self, menu: str, command: str) -> None:
        """A menu bar entry, clicked: ``command`` is JupyterLab's command id for the item."""
        self.page.locator("li.lm-MenuBar-item", has_text=menu).click()
        self.page.locator(f"li.lm-Menu-item[data-command='{command}']").click()

    def run_all(self) -> None:
        """Clear every output, then Run > Run All Cells, and wait for the last cell."""
        prompts = self.page.locator(".jp-CodeCell .jp-InputPrompt")
        self.command("Edit", "editmenu:clear-all")
        sync_api.expect(prompts.filter(has_text=re.compile(r"\d"))).to_have_count(0)
        self.command("Run", "runmenu:run-all")
        # Done: every code cell has a number. Stopped: the kernel is idle, nothing is queued
        # ([*]) and some cell never ran (a cell raised). Before the run starts, nothing is numbered.
        code_cells = sum(cell["cell_type"] == "code" for cell in self.cells)
        sync_api.expect(prompts).to_have_count(code_cells)
        state = self.page.wait_for_function("""() => {
            const prompts = [...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')]
                .map(p => p.textContent.trim());
            const ran = prompts.filter(p => /^\\[\\d+\\]:$/.test(p)).length;
            const idle = document.querySelector(
                ".jp-Notebook-ExecutionIndicator[data-status='idle']") !== null;
            if (ran === prompts.length) return 'done';
            if (ran > 0 && idle && !prompts.includes('[*]:')) return 'stopped';
            return false;
        }""", timeout=RUN_ALL_S * 1000).json_value()
        self.screenshot("ran")
        if state != "done":
            errors = self.page.locator(".jp-OutputArea-output[data-mime-type="
                                       "'application/vnd.jupyter.stderr']").all_text_contents()
            pytest.fail(f"{self.name}: Run All stopped at a failing cell:\n"
                        + "\n".join(errors)[-3000:])

    def outputs_are_views(self) -> None:
        """Widgets drew as widget views (DOM controls), never as text; charts drew as SVG."""
        sync_api.expect(self.page.locator(".jp-OutputArea-output").filter(
            has_text=re.compile("|".join(map(re.escape, NOT_DRAWN))))).to_have_count(0)
        charts = self.page.locator(CHARTS)
        assert charts.count() > 0, f"{self.name}: no chart drawn"
        undrawn = charts.evaluate_all(
            "els => els.filter(e => e.tagName === 'IMG' ? !(e.complete && e.naturalWidth > 0)"
            " : e.getBoundingClientRect().width === 0).length")
        assert undrawn == 0, f"{self.name}: {undrawn} of {charts.count()} charts not drawn"

    def no_errors(self) -> None:
        assert not self.errors, f"{self.name}: JavaScript errors:\n" + "\n".join(self.errors)

    def widget(self, title: str):
        """The first widget view whose heading (an HTML widget) contains ``title``."""
        view = self.page.locator(".jp-OutputArea-output .widget-vbox").filter(
            has=self.page.locator(":scope > .widget-html", has_text=title)).first
        sync_api.expect(view).to_be_attached()
        return view

    def screenshot(self, step: str, element=None) -> None:
        path = artifacts() / f"{self.name}-{step}.png"
        (element or self.page).screenshot(path=str(path))
        print(f"screenshot: {path}")

    def close(self) -> None:
        """The last state (the one a failure left) as a screenshot, then the tab closed."""
        self.screenshot("last")
        self.context.close()


@pytest.fixture
def open_notebook(chromium, lab):
    pages = []

    def open_(notebook: str) -> Page:
        pages.append(Page(chromium, lab, notebook))
        return pages[-1]
    yield open_
    for page in pages:
        page.close()


def _press_run(profiler) -> None:
    """Press the profiler's run button and wait until it has run (its status is cleared)."""
    status = profiler.locator(".widget-html", has_text="running…")
    profiler.get_by_role("button", name="run", exact=True).click()
    sync_api.expect(status).to_have_count(1)
    sync_api.expect(status).to_have_count(0, timeout=WIDGET_RUN_S * 1000)
    failed = profiler.locator(".widget-html", has_text="failed:")
    assert failed.count() == 0, failed.all_text_contents()


@pytest.mark.timeout(600)
@pytest.mark.runs_notebook("01_gemm_ladder.ipynb")
def test_gemm_ladder_notebook_in_a_browser(open_notebook):
    page = open_notebook("01_gemm_ladder.ipynb")
    page.run_all()
    page.outputs_are_views()

    # The learner's complaint: pressing run put the new result above the old one. A press
    # after a GPU change, then the same press again: one result, the new GPU's.
    profiler = page.widget("Ladder profiler")
    gpu = profiler.locator(".widget-dropdown", has_text="GPU spec").locator("select")
    gpu.select_option("MI355X")
    results = profiler.locator(".widget-output caption", has_text="roofline; performance numbers")
    for _ in range(2):
        _press_run(profiler)
        sync_api.expect(results).to_have_text([re.compile("on the MI355X roofline")])
    assert profiler.locator(".widget-output").locator(CHARTS).count() == 1
    page.screenshot("profiler", profiler)
    page.no_errors()

    if "hints(" not in (NOTEBOOKS / "01_gemm_ladder.ipynb").read_text():
        pytest.skip("all other steps passed; the hint widget step is skipped: notebook 01 has "
                    "no cell showing workbench.exercises.hints(...).widget() yet")
    _show_first_hint(page)
    page.no_errors()


def _show_first_hint(page: Page) -> None:
    """Press "Show hint 1 of n": hint 1 appears (the catalog's text) and the button moves on."""
    from workbench import exercises

    hints = page.widget("Hints for")
    hints.scroll_into_view_if_needed()
    key = re.search(r"Hints for (\S+):", hints.locator(".widget-html").first.text_content()).group(1)
    expected = exercises.get(key).hints
    button = hints.locator("button.widget-button")
    sync_api.expect(button).to_have_text(f"Show hint 1 of {len(expected)}")
    button.click()
    sync_api.expect(button).to_have_text(f"Show hint 2 of {len(expected)}" if len(expected) > 1
                                         else f"all {len(expected)} hints shown")
    shown = hints.locator(".widget-html").nth(1)
    sync_api.expect(shown).to_contain_text(f"Hint 1. {expected[0]}")
    sync_api.expect(shown).not_to_contain_text("Hint 2.")
    page.screenshot("hint", hints)


@pytest.mark.timeout(300)
@pytest.mark.runs_notebook("10_roofline.ipynb")
def test_roofline_notebook_in_a_browser(open_notebook):
    page = open_notebook("10_roofline.ipynb")
    page.run_all()
    page.outputs_are_views()
    for title in ("Ladder profiler", "ISA viewer", "Correctness checker"):
        view = page.widget(title)
        assert view.locator("button.widget-button").count() > 0, title
    page.screenshot("charts", page.page.locator(".jp-Cell", has=page.page.locator(CHARTS)).first)
    page.no_errors()


def _saved_widget_state(lab, notebook: str) -> bool:
    """Whether the served copy of ``notebook`` holds the state of every widget it displays."""
    url, token = lab
    with urllib.request.urlopen(f"{url}/api/contents/{notebook}?token={token}", timeout=30) as reply:
        saved = json.loads(reply.read())["content"]
    state = saved["metadata"].get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {})
    views = [output["data"]["application/vnd.jupyter.widget-view+json"]["model_id"]
             for cell in saved["cells"] for output in cell.get("outputs", [])
             if "application/vnd.jupyter.widget-view+json" in output.get("data", {})]
    return bool(views) and all(view in state.get("state", {}) for view in views)


def _trusted(lab, notebook: str) -> bool:
    """Whether the server trusts the served copy of ``notebook`` (its signature matches: every
    code cell comes back marked trusted), without which JupyterLab draws no widget view."""
    url, token = lab
    with urllib.request.urlopen(f"{url}/api/contents/{notebook}?token={token}", timeout=30) as reply:
        cells = json.loads(reply.read())["content"]["cells"]
    return all(cell["metadata"].get("trusted") for cell in cells if cell["cell_type"] == "code")


def _shut_down_kernels(lab) -> None:
    url, token = lab
    with urllib.request.urlopen(f"{url}/api/sessions?token={token}", timeout=30) as reply:
        sessions = json.loads(reply.read())
    for session in sessions:
        urllib.request.urlopen(urllib.request.Request(
            f"{url}/api/sessions/{session['id']}?token={token}", method="DELETE"), timeout=30)


@pytest.mark.timeout(600)
@pytest.mark.runs_notebook("90_interview_prep.ipynb")
def test_interview_notebook_reopened_after_a_run_draws_its_widget(open_notebook, lab):
    """The learner's complaint: run notebook 90, save, close, reopen: "Error displaying
    widget: model not found". JupyterLab keeps widget state in the file only with the
    jupyterlab-manager setting saveState, which binder/overrides.json turns on. Also: the
    options are radio buttons on one line each, none drawn over another."""
    name = "90_interview_prep.ipynb"
    page = open_notebook(name)
    page.run_all()
    labels = page.page.locator(".widget-radio-box label")
    boxes = [labels.nth(i).bounding_box() for i in range(labels.count())]
    assert len(boxes) >= 3
    assert all(after["y"] >= before["y"] + before["height"] for before, after in zip(boxes, boxes[1:]))
    assert len({box["height"] for box in boxes}) == 1          # no option wraps onto a second line
    # Nothing reads the file until the server has answered the save: jupyter_server writes a
    # notebook in place (its previous copy kept as .~name), and a read that finds it half
    # written puts that previous copy back (atomic writing's recovery), so a test that polled
    # during the save reopened the unsigned pre-save notebook, drawn as static HTML.
    with page.page.expect_response(lambda r: r.request.method == "PUT" and f"/api/contents/{name}" in r.url,
                                   timeout=60_000) as save:
        page.command("File", "docmanager:save")
    assert save.value.ok, f"the save answered {save.value.status}"
    assert _saved_widget_state(lab, name), "the saved notebook lacks its widgets' state"
    _shut_down_kernels(lab)

    assert _trusted(lab, name), "the saved notebook is not trusted (signed): a reopened copy draws no widget"

    # A fresh kernel starts; the widget manager restores the saved models once it has asked
    # that kernel for its own, so a widget reads "Loading widget..." until the kernel answers
    # (late on a busy machine: a CI run gave up after 90 s without waiting for it). One more
    # reload is allowed, from before the save race above was found (two CI runs drew the
    # cell's static HTML copy then); it prints what the first reload drew.
    for attempt in range(2):
        page.page.reload()                                     # the tab reopens the file
        page.wait_loaded()
        cell = page.page.locator(".jp-CodeCell", has_text="cards = FlashCards(deck)")
        cell.scroll_into_view_if_needed()
        output = cell.locator(".jp-Cell-outputArea")
        try:
            sync_api.expect(output.locator(".widget-radio-box")).to_be_attached(timeout=SERVER_START_S * 1000)
            break
        except AssertionError:
            if attempt:
                pytest.fail(f"the reopened FlashCards cell draws no options twice (trusted: {_trusted(lab, name)}); "
                            f"its output reads: {output.inner_text()[:500]!r}")
            print(f"reopened without the widget (trusted: {_trusted(lab, name)}): {output.inner_text()[:200]!r}")
    sync_api.expect(output).not_to_contain_text("Error displaying widget")
    page.screenshot("reopened", cell)
    page.no_errors()
