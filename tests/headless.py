"""A small Chrome DevTools Protocol driver for headless Chromium (tests only).

Launches Debian's ``chromium`` with a fresh profile and no network services, then talks CDP over the
page's websocket (``websocket-client``): navigate, evaluate JavaScript, click, screenshot.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-default-apps", "--disable-extensions", "--mute-audio", "--hide-scrollbars")
CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> str | None:
    env = os.environ.get("MEMLAB_CHROMIUM")
    if env and Path(env).is_file():
        return env
    for name in CANDIDATES:
        p = shutil.which(name)
        if p:
            return p
    return None


class CDPError(RuntimeError):
    pass


class Chromium:
    """``with Chromium(width, height) as b: b.goto(url); b.eval("1+1")``."""

    def __init__(self, width: int = 1400, height: int = 1000, binary: str | None = None, timeout: float = 60.0):
        self.binary = binary or find_chromium()
        if self.binary is None:
            raise FileNotFoundError("no chromium binary on PATH (apt-get install -y chromium)")
        self.width, self.height, self.timeout = width, height, timeout
        self._ids = itertools.count(1)
        self.events: list[dict[str, Any]] = []

    def __enter__(self) -> Chromium:
        import websocket

        self.profile = tempfile.mkdtemp(prefix="memlab-chromium-")
        self.proc = subprocess.Popen(
            [self.binary, *FLAGS, f"--user-data-dir={self.profile}", "--remote-debugging-port=0",
             f"--window-size={self.width},{self.height}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = Path(self.profile) / "DevToolsActivePort"
        deadline = time.monotonic() + self.timeout
        while not (port_file.is_file() and port_file.read_text().strip()):
            if self.proc.poll() is not None:
                raise CDPError(f"{self.binary} exited with {self.proc.returncode} before opening DevTools")
            if time.monotonic() > deadline:
                self.close()
                raise CDPError(f"{self.binary}: no DevToolsActivePort after {self.timeout} s")
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        targets: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=5) as r:
                targets = [t for t in json.loads(r.read()) if t.get("type") == "page"]
            if targets:
                break
            time.sleep(0.1)
        if not targets:
            self.close()
            raise CDPError("chromium opened no page target")
        self.ws = websocket.create_connection(targets[0]["webSocketDebuggerUrl"], timeout=self.timeout,
                                              suppress_origin=True)
        self.send("Page.enable")
        self.send("Runtime.enable")
        self.send("Emulation.setDeviceMetricsOverride", width=self.width, height=self.height, deviceScaleFactor=1,
                  mobile=False)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        ws = getattr(self, "ws", None)
        if ws is not None:
            ws.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        shutil.rmtree(self.profile, ignore_errors=True)

    # ------------------------------------------------------------------------------ protocol
    def send(self, method: str, **params: Any) -> dict[str, Any]:
        i = next(self._ids)
        self.ws.send(json.dumps({"id": i, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == i:
                if "error" in msg:
                    raise CDPError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            self.events.append(msg)

    def goto(self, url: str) -> None:
        self.send("Page.navigate", url=url)
        deadline = time.monotonic() + self.timeout
        while self.eval("document.readyState") != "complete":
            if time.monotonic() > deadline:
                raise CDPError(f"{url}: not loaded after {self.timeout} s")
            time.sleep(0.1)

    def eval(self, expression: str) -> Any:
        r = self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            raise CDPError(f"{expression[:80]!r}: {r['exceptionDetails'].get('exception', {}).get('description')}")
        return r.get("result", {}).get("value")

    def set_value(self, selector: str, value: str | bool) -> None:
        """Set a form control (a select's value, a checkbox's state) and fire its change event, as a user would."""
        prop = "checked" if isinstance(value, bool) else "value"
        self.eval(f"(() => {{ const e = document.querySelector({json.dumps(selector)}); "
                  f"e.{prop} = {json.dumps(value)}; e.dispatchEvent(new Event('change', {{bubbles: true}})); }})()")

    def key(self, key: str) -> None:
        """Press a key on the focused element as a user would (keyDown then keyUp): Enter, Tab, ArrowDown..."""
        code = {"Enter": 13, "Tab": 9, "ArrowDown": 40, "ArrowUp": 38, " ": 32, "Escape": 27}[key]
        text = {"Enter": "\r", " ": " "}.get(key)
        self.send("Input.dispatchKeyEvent", type="keyDown" if text else "rawKeyDown", key=key,
                  windowsVirtualKeyCode=code, **({"text": text} if text else {}))
        self.send("Input.dispatchKeyEvent", type="keyUp", key=key, windowsVirtualKeyCode=code)

    def console_errors(self) -> list[str]:
        out = []
        for e in self.events:
            if e.get("method") == "Runtime.exceptionThrown":
                out.append(str(e["params"]["exceptionDetails"].get("exception", {}).get("description")))
            if e.get("method") == "Runtime.consoleAPICalled" and e["params"].get("type") == "error":
                out.append(" ".join(str(a.get("value")) for a in e["params"].get("args", [])))
        return out

    def screenshot(self, path: str | Path, full_page: bool = False) -> Path:
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            params["captureBeyondViewport"] = True
        data = self.send("Page.captureScreenshot", **params)["data"]
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(base64.b64decode(data))
        return p
