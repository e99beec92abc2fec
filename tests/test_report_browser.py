"""report.html in a real headless browser (Debian's chromium), driven through the DevTools
protocol with a small stdlib websocket client: the page loads from file:// with no network
request, every plot renders as SVG with its data marks, the table sorts, the console has no
error, and a screenshot is saved (into $KERNELAGENT_SCREENSHOT_DIR too, when set)."""

from __future__ import annotations

import base64
import http.client
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import time
from pathlib import Path

import pytest

from tests.test_bench_units import SYNTHETIC, synthetic_run

CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium on this machine (apt-get install chromium)")


class WebSocket:
    """Just enough RFC 6455 for the DevTools protocol: masked text frames out, frames in."""

    def __init__(self, url: str, timeout: float = 30.0):
        m = re.match(r"ws://([^:/]+):(\d+)(/.*)", url)
        assert m, url
        self.sock = socket.create_connection((m.group(1), int(m.group(2))), timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall((f"GET {m.group(3)} HTTP/1.1\r\nHost: {m.group(1)}:{m.group(2)}\r\nUpgrade: websocket\r\n"
                           f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n")
                          .encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(1)
            assert chunk, "websocket handshake: connection closed"
            head += chunk
        assert b" 101 " in head.split(b"\r\n")[0], head

    def _exact(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            assert chunk, "websocket closed"
            data += chunk
        return data

    def send(self, text: str) -> None:
        payload = text.encode()
        header = bytes([0x81])
        n = len(payload)
        if n < 126:
            header += bytes([0x80 | n])
        elif n < 1 << 16:
            header += bytes([0x80 | 126]) + struct.pack(">H", n)
        else:
            header += bytes([0x80 | 127]) + struct.pack(">Q", n)
        mask = os.urandom(4)
        self.sock.sendall(header + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))

    def recv(self) -> str:
        message = b""
        while True:
            b1, b2 = self._exact(2)
            n = b2 & 0x7F
            if n == 126:
                n = struct.unpack(">H", self._exact(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self._exact(8))[0]
            payload = self._exact(n)
            opcode = b1 & 0x0F
            if opcode == 0x9:  # ping: answer it
                self.sock.sendall(bytes([0x8A, 0x80 | len(payload)]) + b"\0\0\0\0" + payload)
                continue
            if opcode == 0x8:
                raise ConnectionError("websocket closed by the browser")
            message += payload
            if b1 & 0x80:
                return message.decode()

    def close(self) -> None:
        self.sock.close()


class Browser:
    def __init__(self, tmp: Path):
        self.proc = subprocess.Popen(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--disable-default-apps", "--disable-extensions", "--no-first-run", "--no-default-browser-check",
             "--mute-audio", f"--user-data-dir={tmp / 'profile'}", "--remote-debugging-port=0",
             "--window-size=1300,900", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        port = None
        deadline = time.monotonic() + 60
        while port is None and time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if not line and self.proc.poll() is not None:
                raise RuntimeError("chromium exited at start")
            m = re.search(r"DevTools listening on ws://[^:]+:(\d+)/", line)
            port = int(m.group(1)) if m else None
        assert port, "chromium did not open its DevTools port"
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("GET", "/json/list")
        pages = [t for t in json.loads(conn.getresponse().read()) if t["type"] == "page"]
        self.ws = WebSocket(pages[0]["webSocketDebuggerUrl"])
        self.next_id = 0
        self.events: list[dict] = []

    def call(self, method: str, **params) -> dict:
        self.next_id += 1
        my_id = self.next_id
        self.ws.send(json.dumps({"id": my_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == my_id:
                assert "error" not in msg, msg
                return msg.get("result", {})
            self.events.append(msg)

    def wait_for(self, method: str, timeout: float = 30.0) -> dict:
        deadline = time.monotonic() + timeout
        for event in self.events:
            if event.get("method") == method:
                return event
        while time.monotonic() < deadline:
            msg = json.loads(self.ws.recv())
            self.events.append(msg)
            if msg.get("method") == method:
                return msg
        raise TimeoutError(method)

    def evaluate(self, expression: str):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        assert "exceptionDetails" not in result, result
        return result["result"].get("value")

    def errors(self) -> list[str]:
        out = []
        for e in self.events:
            method, params = e.get("method"), e.get("params", {})
            if method == "Runtime.exceptionThrown":
                out.append(json.dumps(params["exceptionDetails"])[:500])
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert", "warning"):
                out.append(json.dumps(params.get("args"))[:500])
            elif method == "Log.entryAdded" and params["entry"].get("level") in ("error", "warning"):
                out.append(params["entry"].get("text", "")[:500])
        return out

    def requests(self) -> list[str]:
        return [e["params"]["request"]["url"] for e in self.events if e.get("method") == "Network.requestWillBeSent"]

    def close(self) -> None:
        try:
            self.ws.close()
        finally:
            self.proc.kill()
            self.proc.wait(timeout=30)


@pytest.fixture
def browser(tmp_path):
    b = Browser(tmp_path)
    try:
        yield b
    finally:
        b.close()


def open_page(browser: Browser, path: Path) -> None:
    for domain in ("Runtime.enable", "Log.enable", "Page.enable", "Network.enable"):
        browser.call(domain)
    browser.events.clear()  # a new page: earlier load events and messages are not this page's
    browser.call("Page.navigate", url=path.resolve().as_uri())
    browser.wait_for("Page.loadEventFired")


def screenshot(browser: Browser, path: Path) -> bytes:
    height = browser.evaluate("document.documentElement.scrollHeight")
    browser.call("Emulation.setDeviceMetricsOverride", width=1300, height=int(height), deviceScaleFactor=1,
                 mobile=False)
    png = base64.b64decode(browser.call("Page.captureScreenshot", format="png")["data"])
    path.write_bytes(png)
    extra = os.environ.get("KERNELAGENT_SCREENSHOT_DIR")
    if extra:
        Path(extra).mkdir(parents=True, exist_ok=True)
        (Path(extra) / path.name).write_bytes(png)
    return png


PLOTS_JS = """JSON.stringify(Array.from(document.querySelectorAll('svg.plot')).map(function (s) {
  var r = s.getBoundingClientRect();
  return {id: s.id, declared: +s.getAttribute('data-points'), marks: s.querySelectorAll('.point, .bar').length,
          series: s.querySelectorAll('.series').length, width: r.width, height: r.height};
}))"""


def test_report_renders_in_chromium(browser, tmp_path):
    out = synthetic_run(tmp_path / "bench.sqlite")
    open_page(browser, out / "report.html")
    assert browser.evaluate("document.title").startswith("kernelagent bench")
    plots = {p["id"]: p for p in json.loads(browser.evaluate(PLOTS_JS))}
    assert set(plots) == {"plot-speedups", "plot-fast-p", "plot-cost"}
    for p in plots.values():
        assert p["width"] > 300 and p["height"] > 200, p  # laid out, visible
        assert p["marks"] == p["declared"] > 0, p
    assert plots["plot-fast-p"]["series"] == 2 and plots["plot-fast-p"]["marks"] == 8
    assert plots["plot-cost"]["marks"] == sum(1 for r in SYNTHETIC if r["correct"])
    rows = browser.evaluate("document.querySelectorAll('#problems tbody tr').length")
    assert rows == len(SYNTHETIC)
    # The table sorts (the page's only script): by "vs inductor", descending on the second click.
    browser.evaluate("document.querySelectorAll('#problems th')[6].click()")
    browser.evaluate("document.querySelectorAll('#problems th')[6].click()")
    first = browser.evaluate("document.querySelector('#problems tbody tr td').textContent")
    assert first == "level1/3_softmax"  # 2.2x, the fastest
    png = screenshot(browser, tmp_path / "report.png")
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20000
    assert browser.errors() == []
    assert all(u.startswith(("file:", "data:", "about:")) for u in browser.requests()), browser.requests()


def test_compare_and_cpu_reports_render(browser, tmp_path):
    from kernelagent.bench.report import load_run, write_compare
    from kernelagent.bench.store import Store

    store = tmp_path / "bench.sqlite"
    synthetic_run(store, "a")
    synthetic_run(store, "b", [{**r, "speedup_inductor": r["speedup_inductor"] * 1.3} if r["speedup_inductor"]
                               else r for r in SYNTHETIC])
    with Store(store) as db:
        paths = write_compare(load_run(db, "a"), load_run(db, "b"), tmp_path / "cmp")
    open_page(browser, paths["html"])
    plots = {p["id"]: p for p in json.loads(browser.evaluate(PLOTS_JS))}
    assert plots["plot-versus"]["marks"] == 7 and plots["plot-fast-p"]["series"] == 4
    assert all(p["marks"] == p["declared"] > 0 for p in plots.values())
    screenshot(browser, tmp_path / "compare.png")
    assert browser.errors() == []
    # A CPU run has no meaningful timings: the plots say so instead of drawing nothing silently.
    cpu = [{**r, "speedup_eager": None, "speedup_inductor": None, "timings_meaningful": False} for r in SYNTHETIC]
    out = synthetic_run(store, "cpu", cpu)
    open_page(browser, out / "report.html")
    texts = browser.evaluate("Array.from(document.querySelectorAll('svg.plot .empty')).map(e => e.textContent)")
    assert len(texts) == 3 and all("not meaningful" in t for t in texts)
    assert browser.errors() == []
