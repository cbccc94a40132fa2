"""The HTML export fits a 1200 px window: measured by a real headless browser, not by reading the CSS."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from test_export import HOST, glibcxx_finding

from zdoctor.core.model import Evidence, Finding, Remedy
from zdoctor.report.export import render
from zdoctor.walk.session import SessionLog, load_events

BROWSER = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(BROWSER is None, reason="needs chromium (the CI installs it)")

ENV = "/opt/conda/envs/train-with-a-rather-long-environment-name"
LAYERS = ["layer", "path", "version", "owner", "GLIBCXX range", "loaded by", "state / why"]


def wide_session() -> str:
    """A session whose export holds what made pages scroll: a many-column table of long paths, long
    unbroken tokens in prose and inline code, long command lines and a long interpreter path."""
    log = SessionLog.create("tui", ["--python", f"{ENV}/bin/python3.10"], dict(HOST, python=f"{ENV}/bin/python"))
    rows = [[f"layer {i}", f"{ENV}/lib/python3.10/site-packages/torch/lib/libtorch_cpu_{i}.so",
             f"GLIBCXX_3.4.{20 + i}", f"pip:torch-2.3.1+cu121-{'x' * 30}", "GLIBCXX_3.4.9..GLIBCXX_3.4.30",
             f"{ENV}/lib/python3.10/site-packages/deepspeed/ops/adam/cpu_adam_op.so",
             "unmounted: /dev/nvme3n1 has no filesystem and no partition table" + "-" * 40] for i in range(6)]
    table = Evidence.of_table("toolchain layers", LAYERS, rows, highlight=[2])
    token = "sha256:" + "0123456789abcdef" * 12
    cmd = f"export LD_LIBRARY_PATH={':'.join(f'{ENV}/lib/dir{i}' for i in range(12))}"
    log.record("finding", {"finding": glibcxx_finding()})
    log.record("finding", {"finding": Finding(
        "toolchain.layers", "warn", f"layer {token} is loaded from {ENV}/lib/{'libstdc++.so.6.0.29' * 4}",
        f"`{token}` {token}", evidence=[table, Evidence(label="trace", argv=["strace", "-f", "-e", cmd],
                                                        exit_code=0, stdout=token * 3)],
        remedies=[Remedy("Load the conda copy first", commands=[cmd, cmd + "-again"], undo=[cmd])])})
    log.close(1)
    return log.id


def page_width(html: str, tmp: Path, window: int = 1200) -> tuple[int, int]:
    """(document scroll width, viewport width) of ``html`` as a real headless browser lays it out."""
    probe = ("<script>window.addEventListener('load', () => { document.body.setAttribute('data-measured', "
             "document.documentElement.scrollWidth + 'x' + window.innerWidth); });</script>")
    page = tmp / "export.html"
    page.write_text(html.replace("</body>", probe + "</body>"), encoding="utf-8")
    out = subprocess.run([BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                          "--no-first-run", f"--user-data-dir={tmp / 'profile'}", f"--window-size={window},900",
                          "--hide-scrollbars", "--dump-dom", page.as_uri()],
                         capture_output=True, text=True, timeout=60)
    found = re.search(r'data-measured="(\d+)x(\d+)"', out.stdout)
    assert found, out.stderr[-2000:]
    return int(found.group(1)), int(found.group(2))


def test_the_html_export_does_not_scroll_sideways_at_1200px(state_home: Path, tmp_path: Path):
    html = render(load_events(wide_session()), "html")
    width, viewport = page_width(html, tmp_path)
    assert viewport == 1200  # the browser really laid the page out at the width under test
    assert width <= 1200, f"the page is {width} px wide in a 1200 px window"
    assert "libtorch_cpu_0.so" in html and "state / why" in html  # the wide content is on the page
