"""Run every notebook in JupyterLab in a real browser, and fail on what a reader would see wrong.

``make browser-test`` runs this script. It starts JupyterLab on loopback (``lab_server``),
drives Debian's Chromium with Playwright, and for each notebook: opens it, clears the stored
outputs, runs all cells through JupyterLab's own ``notebook:run-all-cells`` command, waits
(bounded) until the run has finished and the kernel is idle, then checks every cell
(``expectations``): no error output, no traceback on stderr, every cell ran, every figure the
committed notebook stored is shown, every widget rendered. One screenshot per notebook goes to
the screens folder. Exit status 1, with one line per problem naming the notebook and the cell,
when anything is wrong.

    python tests/browser/run_notebooks.py [--notebooks notebooks] [--screens figures/screens]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import self_check
from expectations import WIDGET_ERRORS, WIDGET_MIME, problems
from lab_server import running_lab
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import sync_playwright

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"]
VIEWPORT = {"width": 1280, "height": 860}
SCREEN_LIMIT = 300_000  # bytes: a screenshot is committed, so it stays small

OPEN_JS = """async (path) => {
  const app = window.jupyterapp;
  await app.restored;
  app.shell.collapseLeft();
  const panel = await app.commands.execute('docmanager:open', {path, factory: 'Notebook'});
  await panel.context.ready;
  await panel.sessionContext.ready;
  for (const other of [...app.shell.widgets('main')]) if (other !== panel) other.close();
  app.shell.activateById(panel.id);
  window.c2graphPanel = panel;
  window.c2graphRun = null;
  return panel.content.widgets.length;
}"""

KERNEL_JS = """() => {
  const kernel = window.c2graphPanel.sessionContext.session?.kernel;
  return kernel ? kernel.status : 'no kernel';
}"""

CLEAR_AND_RUN_JS = """async () => {
  const app = window.jupyterapp, panel = window.c2graphPanel;
  app.shell.activateById(panel.id);
  await app.commands.execute('notebook:clear-all-cell-outputs');
  const left = panel.content.widgets.filter(c => c.model.type === 'code' && c.model.outputs.length > 0).length;
  window.c2graphRun = {done: false};
  app.commands.execute('notebook:run-all-cells').then(
    ok => { window.c2graphRun = {done: true, ok}; },
    error => { window.c2graphRun = {done: true, error: String(error)}; });
  return left;
}"""

PROGRESS_JS = """() => {
  const panel = window.c2graphPanel, kernel = panel.sessionContext.session?.kernel;
  const code = panel.content.widgets.filter(c => c.model.type === 'code');
  return {run: window.c2graphRun, kernel: kernel ? kernel.status : 'no kernel',
          ran: code.filter(c => c.model.executionCount !== null).length, code: code.length,
          running: code.filter(c => c.model.executionState === 'running').length,
          errors: code.filter(c => c.model.outputs.toJSON().some(o => o.output_type === 'error')).length};
}"""

STATE_JS = """() => window.c2graphPanel.content.widgets.map(cell => {
  const model = cell.model;
  if (model.type !== 'code') return {type: model.type};
  const children = cell.outputArea.widgets;
  return {
    type: 'code',
    count: model.executionCount,
    shown: children.length,
    outputs: model.outputs.toJSON().map((o, i) => {
      const node = children[i] ? children[i].node : null;
      const output = node ? node.querySelector('.jp-OutputArea-output') : null;
      const stderr = node ? node.querySelector('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]') : null;
      return {
        type: o.output_type, name: o.name || null, mimes: Object.keys(o.data || {}),
        ename: o.ename || null, evalue: o.evalue || null,
        text: output ? output.innerText.slice(0, 300) : '',
        stderr: stderr ? stderr.innerText.slice(-2000) : '',
        images: node ? [...node.querySelectorAll('img')].filter(img => img.complete && img.naturalWidth > 0).length : 0,
        widget: output ? output.querySelector('.jupyter-widgets') !== null : false,
      };
    }),
  };
})"""

SCROLL_JS = """(index) => {
  const cells = window.c2graphPanel.content.widgets;
  cells[index].node.scrollIntoView({block: 'start'});
}"""

CLOSE_JS = """async () => {
  const panel = window.c2graphPanel;
  panel.context.model.dirty = false;
  await panel.sessionContext.shutdown();
  panel.dispose();
}"""


def log(message: str) -> None:
    print(message, flush=True)


def wait_for(page, what: str, condition, timeout_s: float, poll_s: float = 1.0):
    """Poll ``condition()`` until it returns a true value; ``TimeoutError`` naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not done after {timeout_s:.0f} s")
        page.wait_for_timeout(poll_s * 1000)


def run_all(page, name: str, timeout_s: float) -> dict:
    """Clear outputs, Run All, and wait until the run is over and the kernel idle (bounded)."""
    wait_for(page, f"{name}: kernel start", lambda: page.evaluate(KERNEL_JS) == "idle", 120)
    left = page.evaluate(CLEAR_AND_RUN_JS)
    if left:
        raise RuntimeError(f"{name}: {left} cells kept their outputs after clear-all-cell-outputs")
    start, last = time.monotonic(), [None]

    def finished():
        state = page.evaluate(PROGRESS_JS)
        if state["kernel"] in ("dead", "no kernel"):
            raise RuntimeError(f"{name}: the kernel is {state['kernel']} after {state['ran']} of {state['code']} cells")
        if (state["ran"], state["errors"]) != last[0]:
            last[0] = (state["ran"], state["errors"])
            log(f"  {name}: {state['ran']}/{state['code']} cells ran ({time.monotonic() - start:.0f} s)")
        done = state["run"] and state["run"]["done"] and state["kernel"] == "idle" and not state["running"]
        return state if done else None

    state = wait_for(page, f"{name}: Run All", finished, timeout_s)
    log(f"  {name}: run finished in {time.monotonic() - start:.0f} s")
    return state


def wait_for_widgets(page, name: str, timeout_s: float) -> None:
    """Wait (bounded) until every widget output is rendered or has failed for good."""
    def settled():
        cells = page.evaluate(STATE_JS)
        widgets = [o for c in cells if c["type"] == "code" for o in c["outputs"] if WIDGET_MIME in o["mimes"]]
        return all(o["widget"] or any(t in o["text"] for t in WIDGET_ERRORS) for o in widgets)
    try:
        wait_for(page, f"{name}: widgets", settled, timeout_s)
    except TimeoutError:
        pass  # the verdict names each widget that did not render


def screenshot(page, seen: list[dict], path: Path) -> int:
    """The first widget, else the first figure, else the top: one PNG kept under ``SCREEN_LIMIT``."""
    def first(test):
        return next((i for i, c in enumerate(seen) if c["type"] == "code" and test(c)), 0)
    index = (first(lambda c: any(WIDGET_MIME in o["mimes"] for o in c["outputs"]))
             or first(lambda c: any(o["images"] for o in c["outputs"])))
    page.evaluate(SCROLL_JS, index)
    page.wait_for_timeout(500)
    path.parent.mkdir(parents=True, exist_ok=True)
    height = VIEWPORT["height"]
    while True:
        page.screenshot(path=str(path), clip={"x": 0, "y": 0, "width": VIEWPORT["width"], "height": height})
        size = path.stat().st_size
        if size <= SCREEN_LIMIT or height <= 400:
            return size
        height -= 120


def check_notebook(page, name: str, nb: dict, timeout_s: float, screen: Path | None = None) -> list[str]:
    """Open ``name``, run it, screenshot it to ``screen``, close it; the problems found (empty: pass)."""
    start = time.monotonic()
    page.evaluate(OPEN_JS, name)
    try:
        run_all(page, name, timeout_s)
        wait_for_widgets(page, name, 60)
        seen = page.evaluate(STATE_JS)
        shot = f"; screenshot {screenshot(page, seen, screen) // 1000} KB" if screen else ""
        found = problems(name, nb, seen)
        log(f"  {name}: {len(found)} problem(s) in {time.monotonic() - start:.0f} s{shot}")
        return found
    finally:
        page.evaluate(CLOSE_JS)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--notebooks", type=Path, default=Path("notebooks"))
    parser.add_argument("--screens", type=Path, default=Path("figures/screens"))
    parser.add_argument("--browser", default="/usr/bin/chromium")
    parser.add_argument("--notebook-timeout", type=float, default=600, help="seconds for one notebook's Run All")
    parser.add_argument("--only", nargs="*", default=None, help="notebook file names (default: every notebook)")
    args = parser.parse_args(argv)
    names = sorted(p.name for p in args.notebooks.glob("*.ipynb") if args.only is None or p.name in args.only)
    if not names:
        print(f"no notebook to run in {args.notebooks}", file=sys.stderr)
        return 2
    found, start = [], time.monotonic()
    committed = {name: (args.notebooks / name).read_bytes() for name in names}
    broken = self_check.broken_notebook()
    with running_lab(args.notebooks, {self_check.NAME: broken}) as lab, sync_playwright() as playwright:
        log(f"JupyterLab at {lab.url}, serving a copy of {args.notebooks}/")
        browser = playwright.chromium.launch(executable_path=args.browser, headless=True, args=CHROMIUM_ARGS,
                                             timeout=120_000)
        try:
            page = browser.new_page(viewport=VIEWPORT)
            page.set_default_timeout(120_000)
            page.on("pageerror", lambda error: log(f"  (page error: {str(error).splitlines()[0][:160]})"))
            page.goto(f"{lab.url}/lab?token={lab.token}", wait_until="domcontentloaded")
            page.wait_for_function("() => window.jupyterapp !== undefined", timeout=180_000)
            log(f"{self_check.NAME} (broken on purpose: the checks must report exactly its problems)")
            try:
                found += self_check.unexpected(check_notebook(page, self_check.NAME, broken, 120))
            except (TimeoutError, RuntimeError, PlaywrightError) as e:
                found.append(f"self-check: {e}")
            for name in names:
                log(f"{name}")
                nb = json.loads(committed[name])
                try:
                    found += check_notebook(page, name, nb, args.notebook_timeout, args.screens / f"{Path(name).stem}.png")
                except (TimeoutError, RuntimeError, PlaywrightError) as e:
                    found.append(f"{name}: {e}")
        finally:
            browser.close()
    took = time.monotonic() - start
    found += [f"{name}: the committed notebook changed during the run (only a copy is served)"
              for name, data in committed.items() if (args.notebooks / name).read_bytes() != data]
    if found:
        print(f"\nbrowser test FAILED ({len(found)} problem(s), {took:.0f} s):", file=sys.stderr)
        for line in found:
            print(f"  {line}", file=sys.stderr)
        return 1
    log(f"browser test passed: {len(names)} notebooks ran in JupyterLab without an error, every figure and "
        f"widget shown ({took:.0f} s); screenshots in {args.screens}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
