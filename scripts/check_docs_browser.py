#!/usr/bin/env python3
"""Load every page of the built documentation site in headless Chromium and fail on what
a reader would meet: a console error, an uncaught exception, a failed load (a missing
script or stylesheet shows as a console error); then search for ops as a reader would and
check the search finds their pages.

Chromium is driven over its DevTools protocol on a pipe (``--remote-debugging-pipe``:
NUL-separated JSON on file descriptors 3 and 4), so nothing beyond Chromium itself is
needed: no webdriver, no websocket library.

    python scripts/check_docs_browser.py [--chromium chromium] [--search mul_mat,rope_ext] build/docs/html
"""

from __future__ import annotations

import argparse
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


class Chromium:
    """A headless Chromium with one page, over the DevTools pipe."""

    def __init__(self, exe: str, timeout: float = 30.0):
        self.timeout = timeout
        self.profile = tempfile.mkdtemp(prefix="pyggml-docs-chromium-")
        to_r, self.to_w = os.pipe()         # our commands: Chromium reads fd 3
        self.from_r, from_w = os.pipe()     # its replies and events: Chromium writes fd 4

        def fds():
            a, b = os.dup(to_r), os.dup(from_w)       # out of the way of 3 and 4 first
            os.dup2(a, 3)
            os.dup2(b, 4)
        self.proc = subprocess.Popen(
            [exe, "--headless=new", "--remote-debugging-pipe", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--no-default-browser-check", "--disable-extensions", f"--user-data-dir={self.profile}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, close_fds=False,
            preexec_fn=fds)
        os.close(to_r)
        os.close(from_w)
        self.buf = b""
        self.next_id = 0
        self.events: list[dict] = []
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable", session=True)

    def _read(self, deadline: float) -> dict | None:
        while b"\0" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            r, _, _ = select.select([self.from_r], [], [], left)
            if not r:
                return None
            chunk = os.read(self.from_r, 1 << 16)
            if not chunk:
                raise RuntimeError("Chromium closed its DevTools pipe")
            self.buf += chunk
        msg, self.buf = self.buf.split(b"\0", 1)
        return json.loads(msg)

    def call(self, method: str, params: dict | None = None, session: bool = False) -> dict:
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = self.session
        os.write(self.to_w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        while True:
            m = self._read(deadline)
            if m is None:
                raise TimeoutError(f"Chromium did not answer {method} in {self.timeout} s")
            if m.get("id") == self.next_id:
                if "error" in m:
                    raise RuntimeError(f"{method}: {m['error']}")
                return m.get("result", {})
            self.events.append(m)

    def wait_event(self, method: str, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            for i, e in enumerate(self.events):
                if e.get("method") == method:
                    del self.events[i]
                    return True
            m = self._read(deadline)
            if m is None:
                return False
            self.events.append(m)

    def drain(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while (m := self._read(deadline)) is not None:
            self.events.append(m)

    def evaluate(self, expr: str):
        r = self.call("Runtime.evaluate", {"expression": expr, "returnByValue": True}, session=True)
        return r.get("result", {}).get("value")

    def close(self) -> None:
        try:
            self.call("Browser.close")
        except Exception:
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self.to_w)
        os.close(self.from_r)
        shutil.rmtree(self.profile, ignore_errors=True)


def _problems(events: list[dict]) -> list[str]:
    out = []
    for e in events:
        m, p = e.get("method"), e.get("params", {})
        if m == "Runtime.exceptionThrown":
            d = p.get("exceptionDetails", {})
            out.append(f"uncaught exception: {d.get('exception', {}).get('description') or d.get('text')}")
        elif m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            out.append("console." + p["type"] + ": " + " ".join(str(a.get("value", a.get("description", "")))
                                                                 for a in p.get("args", [])))
        elif m == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
            ent = p["entry"]
            out.append(f"{ent.get('source')}: {ent.get('text')} {ent.get('url', '')}".strip())
    return out


def check_pages(browser: Chromium, root: Path, pages: list[Path], settle: float = 0.05) -> dict[str, list[str]]:
    bad: dict[str, list[str]] = {}
    for p in pages:
        browser.events.clear()
        browser.call("Page.navigate", {"url": p.resolve().as_uri()}, session=True)
        if not browser.wait_event("Page.loadEventFired", browser.timeout):
            bad[str(p.relative_to(root))] = ["the page did not finish loading"]
            continue
        browser.drain(settle)
        found = _problems(browser.events)
        if found:
            bad[str(p.relative_to(root))] = found
    return bad


def search_finds(browser: Chromium, root: Path, term: str, want: str, timeout: float = 15.0) -> list[str]:
    """The result links Sphinx's search page shows for ``term`` (empty if it shows none in
    ``timeout``), polled until one ends with ``want``."""
    browser.call("Page.navigate", {"url": (root / "search.html").resolve().as_uri() + f"?q={term}"}, session=True)
    browser.wait_event("Page.loadEventFired", browser.timeout)
    deadline = time.monotonic() + timeout
    links: list[str] = []
    while time.monotonic() < deadline:
        links = browser.evaluate("Array.from(document.querySelectorAll('#search-results a')).map(a => a.href)") or []
        if any(u.split("#")[0].endswith(want) for u in links):
            break
        browser.drain(0.2)
    return links


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("html", help="the built site (build/docs/html)")
    ap.add_argument("--chromium", default=shutil.which("chromium") or "chromium")
    ap.add_argument("--search", default="mul_mat,rope_ext,flash_attn_back",
                    help="ops to search for (comma-separated): each must find its page")
    ap.add_argument("--timeout", type=float, default=30.0)
    args = ap.parse_args(argv)
    root = Path(args.html)
    pages = sorted(p for p in root.rglob("*.html") if "_static" not in p.parts and "_sources" not in p.parts)
    t0 = time.perf_counter()
    browser = Chromium(args.chromium, args.timeout)
    try:
        version = browser.call("Browser.getVersion").get("product", "?")
        bad = check_pages(browser, root, pages)
        missing = []
        for term in filter(None, args.search.split(",")):
            links = search_finds(browser, root, term, f"ops/{term}.html")
            if not any(u.split("#")[0].endswith(f"ops/{term}.html") for u in links):
                missing.append(f"{term} ({len(links)} results, none ops/{term}.html)")
    finally:
        browser.close()
    took = time.perf_counter() - t0
    for page, found in bad.items():
        print(f"check_docs_browser: {page}: " + "; ".join(found))
    for m in missing:
        print(f"check_docs_browser: the search did not find {m}")
    if bad or missing:
        return 1
    print(f"check_docs_browser: {len(pages)} pages loaded in {version} without a console error or an uncaught "
          f"exception; the search finds {args.search.replace(',', ', ')} ({took:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
