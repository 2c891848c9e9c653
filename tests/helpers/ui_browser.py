"""A real headless Chromium (Debian's `chromium` + `chromium-driver`) driven through Selenium, for the ui tests
and the ui benchmark; every request the page makes is read from the browser's own network log."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit


def chromium_paths() -> tuple[str, str]:
    """(browser, driver); `make browser` installs both (Debian: chromium, chromium-driver)."""
    browser = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
    driver = shutil.which("chromedriver")
    if browser is None or driver is None:
        raise RuntimeError("No chromium/chromedriver on PATH: `make browser` installs Debian's chromium and chromium-driver.")
    return browser, driver


@contextmanager
def chromium(width: int = 1300, height: int = 1000) -> Iterator[Any]:
    """A headless Chromium session that records its network requests (``requested_hosts``)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    browser, driver_path = chromium_paths()
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars",
                f"--window-size={width},{height}", "--no-first-run", "--disable-background-networking"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def requested_urls(driver: Any) -> list[str]:
    """Every URL the page asked for since the last call (the DevTools log, as Chromium saw it)."""
    urls = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message.get("method") == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    return urls


def outside(urls: list[str], host: str = "127.0.0.1") -> list[str]:
    """The URLs that leave ``host`` (data: and blob: URLs stay in the page)."""
    return [u for u in urls if urlsplit(u).scheme not in ("data", "blob", "about") and urlsplit(u).hostname != host]


@contextmanager
def served(db: str, allowed_hosts: tuple[str, ...] = ()) -> Iterator[str]:
    """The page of store `db` served on a free port of 127.0.0.1, in a thread; yields its URL."""
    import threading

    from multirank_logger.ui.server import UiServer

    server = UiServer(db, "127.0.0.1", 0, allowed_hosts)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()
    try:
        yield server.url
    finally:
        server.shutdown()
        server.server_close()


def wait_for(driver: Any, script: str, timeout: float = 90) -> Any:
    """The first truthy value `script` returns in the page, polled; fails with the page's text after `timeout`."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = driver.execute_script(script)
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"never true: {script}\n{driver.find_element('tag name', 'body').text[:2000]}")
