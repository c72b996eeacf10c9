"""The workbook in a real browser: JupyterLab in headless Chromium runs every notebook and draws its widgets.

Skipped by `pytest tests`; `make test-ui` installs playwright and Debian's chromium and runs
`pytest tests/ui --run-ui`. Screenshots go to tests/ui/artifacts/ (git-ignored).
"""

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.ui

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted(p.stem for p in (REPO / "notebooks").glob("[0-9]*.ipynb"))
ARTIFACTS = Path(__file__).resolve().parent / "artifacts"
CHROMIUM = os.environ.get("MOE_LAB_CHROMIUM", "/usr/bin/chromium")
# The closed network refuses Chromium's background connections; these flags keep it from trying.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

SERVER_START_S = 120
PAGE_LOAD_MS = 120_000
KERNEL_START_MS = 120_000
RUN_ALL_MS = 180_000  # the slowest notebook takes ~25 s under the interpreter; leave room on 2 cores
WIDGET_MS = 60_000

# Per-user JupyterLab settings for the test server: no news prompt over the notebook, no autosave.
LAB_SETTINGS = {
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false"},
    "@jupyterlab/docmanager-extension/plugin.jupyterlab-settings": {"autosave": False},
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LabServer:
    def __init__(self, root: Path, scratch: Path):
        self.port = _free_port()
        self.token = secrets.token_hex(24)
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = scratch / "jupyterlab.log"
        settings = scratch / "user-settings"
        for rel, value in LAB_SETTINGS.items():
            (settings / rel).parent.mkdir(parents=True, exist_ok=True)
            (settings / rel).write_text(json.dumps(value))
        cmd = [
            sys.executable,
            "-m",
            "jupyterlab",
            "--no-browser",
            "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={self.port}",
            "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={self.token}",
            f"--ServerApp.root_dir={root}",
            # window.jupyterapp: the test runs lab commands and reads cell outputs through it
            "--LabApp.expose_app_in_browser=True",
            f"--LabApp.user_settings_dir={settings}",
            f"--LabApp.workspaces_dir={scratch / 'workspaces'}",
            # a safety net: should this process die without its finalizer, the server stops itself
            "--ServerApp.shutdown_no_activity_timeout=900",
        ]
        if os.geteuid() == 0:
            cmd.append("--allow-root")
        env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(scratch / "runtime"))
        self._log = open(self.log_path, "w")
        # Own process group, so the finalizer can stop the server and anything it started.
        self.proc = subprocess.Popen(
            cmd,
            cwd=root,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    def api(self, path: str, method: str = "GET"):
        req = urllib.request.Request(
            f"{self.url}/api/{path}", method=method, headers={"Authorization": f"token {self.token}"}
        )
        with urllib.request.urlopen(req, timeout=30) as resp:
            body = resp.read()
        return json.loads(body) if body else None

    def wait_until_up(self):
        deadline = time.monotonic() + SERVER_START_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"JupyterLab exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                self.api("status")
                return
            except OSError:
                time.sleep(0.5)
        raise TimeoutError(f"JupyterLab did not answer within {SERVER_START_S} s:\n{self.log_tail()}")

    def shutdown_kernels(self):
        for session in self.api("sessions"):
            self.api(f"sessions/{session['id']}", method="DELETE")

    def stop(self):
        # SIGTERM lets the server shut its kernels down (they run in sessions of their own); then make sure.
        for sig, wait_s in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(wait_s)
                break
            except subprocess.TimeoutExpired:
                continue
        self._log.close()

    def log_tail(self, chars: int = 4000) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-chars:]


@pytest.fixture(scope="module")
def artifacts():
    shutil.rmtree(ARTIFACTS, ignore_errors=True)
    ARTIFACTS.mkdir(parents=True)
    return ARTIFACTS


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    scratch = tmp_path_factory.mktemp("jupyterlab")
    # A copy of notebooks/: running the cells in the browser must never rewrite the committed notebooks.
    root = scratch / "notebooks"
    shutil.copytree(REPO / "notebooks", root)
    server = LabServer(root, scratch)
    try:
        server.wait_until_up()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def browser_context(tmp_path_factory):
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: `make test-ui` installs Debian's chromium")
    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            tmp_path_factory.mktemp("chromium-profile"),
            executable_path=CHROMIUM,
            args=CHROMIUM_ARGS,
            headless=True,
            viewport={"width": 1400, "height": 1000},
        )
        try:
            yield context
        finally:
            context.close()


@pytest.fixture
def page(lab, browser_context):
    page = browser_context.new_page()
    page.set_default_timeout(PAGE_LOAD_MS)
    try:
        yield page
    finally:
        page.close()
        lab.shutdown_kernels()  # one kernel at a time: each holds torch and Triton


def open_and_run_all(page, lab, name: str):
    """Open notebooks/<name>.ipynb in JupyterLab, run all cells, wait until the kernel is idle again."""
    # reset: a fresh workspace, so lab does not reopen (and start kernels for) the notebooks of earlier tests
    page.goto(f"{lab.url}/lab/tree/{name}.ipynb?reset&token={lab.token}")
    page.wait_for_function(f"() => window.jupyterapp?.shell.currentWidget?.context?.path === '{name}.ipynb'")
    page.evaluate("() => window.jupyterapp.commands.execute('application:toggle-left-area')")  # room for the notebook
    # The notebook's language_info picks the kernel; without it lab asks, and a learner takes the default.
    kernel_idle = "window.jupyterapp.shell.currentWidget.sessionContext.session?.kernel?.status === 'idle'"
    page.wait_for_function(
        f"() => {kernel_idle} || document.querySelector('.jp-Dialog') !== null", timeout=KERNEL_START_MS
    )
    if page.locator(".jp-Dialog", has_text="Select Kernel").count():
        page.locator(".jp-Dialog .jp-mod-accept").click()
    page.wait_for_function(f"() => {kernel_idle}", timeout=KERNEL_START_MS)
    # The same command as Run > Run All Cells; its promise settles when the last cell has run.
    page.evaluate("""() => {
        window.__runAll = 'running';
        window.jupyterapp.commands.execute('notebook:run-all-cells')
            .then(ok => { window.__runAll = String(ok); }, err => { window.__runAll = 'failed: ' + err; });
    }""")
    page.wait_for_function("() => window.__runAll !== 'running'", timeout=RUN_ALL_MS)
    page.wait_for_function(f"() => {kernel_idle}", timeout=RUN_ALL_MS)
    return page.evaluate("() => window.__runAll")


def cell_problems(page) -> list:
    """Error outputs, tracebacks and unexecuted code cells of the open notebook, read from its model."""
    return page.evaluate("""() => {
        const problems = [];
        window.jupyterapp.shell.currentWidget.content.widgets.forEach((cell, i) => {
            if (cell.model.type !== 'code') return;
            if (cell.model.executionCount === null) problems.push(`cell ${i}: not executed`);
            for (const out of cell.model.outputs.toJSON()) {
                if (out.output_type === 'error')
                    problems.push(`cell ${i}: ${out.ename}: ${out.evalue}`);
                const text = [].concat(out.text || '').join('');
                if (text.includes('Traceback (most recent call last)'))
                    problems.push(`cell ${i}: traceback in ${out.name}: ${text.slice(-300)}`);
            }
        });
        return problems;
    }""")


def wait_for_widgets(page):
    """Every widget view is drawn: no 'Loading widget...' placeholder, no 'Error displaying widget'."""
    page.wait_for_function(
        """() => {
        const text = document.querySelector('.jp-Notebook').innerText;
        return !text.includes('Loading widget') && !text.includes('Error displaying widget');
    }""",
        timeout=WIDGET_MS,
    )


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs_clean_in_jupyterlab(page, lab, artifacts, name):
    result = open_and_run_all(page, lab, name)
    page.screenshot(path=artifacts / f"{name}.png")  # before the checks: a failing notebook leaves one too
    assert cell_problems(page) == [], f"{name}: cells failed in JupyterLab"
    assert result == "true", f"{name}: Run All Cells reported {result}"
    wait_for_widgets(page)
    page.screenshot(path=artifacts / f"{name}.png")
    widget_outputs = page.locator(".jp-OutputArea-child", has=page.locator(".jupyter-widgets"))
    if widget_outputs.count():  # the outermost (first) one: the notebook's first widget
        widget_outputs.first.scroll_into_view_if_needed()
        widget_outputs.first.screenshot(path=artifacts / f"{name}-widget.png")


def test_align_widget_redraws_on_slider(page, lab, artifacts):
    assert open_and_run_all(page, lab, "02_align") == "true"
    wait_for_widgets(page)
    slider = page.locator(".widget-hslider", has_text="BLOCK_SIZE_M")
    box = page.locator(".jp-OutputArea-output .widget-vbox", has=slider)
    figure = box.locator(".widget-output img")
    box.scroll_into_view_if_needed()
    figure.wait_for()
    assert slider.locator(".widget-readout").inner_text().strip() == "16"
    src_before = figure.get_attribute("src")
    shot_before = box.screenshot(path=artifacts / "02_align-widget-before.png")

    # Drag the handle to the third of the four stops (16, 32, 64, 128): BLOCK_SIZE_M = 64.
    track = slider.locator(".noUi-target").bounding_box()
    handle = slider.locator(".noUi-handle").bounding_box()
    page.mouse.move(handle["x"] + handle["width"] / 2, handle["y"] + handle["height"] / 2)
    page.mouse.down()
    page.mouse.move(track["x"] + track["width"] * 2 / 3, track["y"] + track["height"] / 2, steps=10)
    page.mouse.up()

    # The Output widget replaces its <img> on each redraw; look it up again inside the (kept) VBox.
    page.wait_for_function(
        "([box, before]) => { const img = box.querySelector('.widget-output img'); return img && img.src !== before; }",
        arg=[box.element_handle(), src_before],
        timeout=WIDGET_MS,
    )
    assert slider.locator(".widget-readout").inner_text().strip() == "64"
    assert "BLOCK_SIZE_M= 64" in box.locator(".widget-html").inner_text()
    figure.wait_for()
    shot_after = box.screenshot(path=artifacts / "02_align-widget-after.png")
    assert figure.get_attribute("src") != src_before
    assert shot_after != shot_before
    assert cell_problems(page) == []

    # JupyterLab showing the widget under its heading, cut below it (docs/img/align-widget.png comes from here).
    heading = page.locator(".jp-MarkdownCell", has_text="Widget: pick BLOCK_SIZE_M")
    heading.evaluate("cell => cell.scrollIntoView({block: 'start'})")
    page.wait_for_timeout(500)  # let the windowed notebook settle after the scroll
    bottom = box.bounding_box()["y"] + box.bounding_box()["height"]
    page.screenshot(
        path=artifacts / "02_align-widget-lab.png",
        clip={"x": 0, "y": 0, "width": page.viewport_size["width"], "height": bottom + 8},
    )
