"""Headless Chromium for the web app's browser tests, its benchmark and its screenshots.

NOTE: the flags matter on machines with no network: without the background-networking ones
Chromium keeps trying to reach its update and sync hosts, and those connections are refused.
"""
from __future__ import annotations

import tempfile

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


def headless_chromium(user_data_dir: str | None = None, width: int = 1500, height: int = 1000, extra=()):
    """A selenium Chrome driver on Debian's chromium, with the browser console log kept."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run",
                f"--user-data-dir={user_data_dir or tempfile.mkdtemp(prefix='opscope-chrome-')}",
                f"--window-size={width},{height}", *extra):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
