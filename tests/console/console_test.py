#!/usr/bin/env python3
"""Browser test of the Narad web console (`/console`), headless Chromium through Selenium.

Environment:
  NARAD_URL          broker base URL, e.g. http://127.0.0.1:8080 or https://x/prod (required)
  NARAD_USER         user name (required)
  NARAD_PASS         password (required)
  NARAD_SCREENSHOTS  where to write topics.png, message.png, failure.png
                     (default ./console-screenshots)

Steps: (re)create topic `console-demo` with 2 partitions and produce 5 messages through the
API; sign in through the console; wait for the topic's backlog of 5; open the topic and peek
the JSON message; check that the console leased nothing. Exits 1 with a message on failure.

Setup: pip install -r tests/console/requirements.txt; apt-get install chromium chromium-driver.
"""

import base64
import json
import os
import sys
import urllib.error
import urllib.request

from selenium import webdriver
from selenium.common.exceptions import TimeoutException
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait

TOPIC = "console-demo"
JSON_MESSAGE = {"hello": "console", "n": 1}
HTML_LOOKALIKE = "<b>not markup</b> & <script>alert(1)</script>"
MESSAGES = [
    b"first message, plain text",
    json.dumps(JSON_MESSAGE).encode(),
    HTML_LOOKALIKE.encode(),
    b"fourth message",
    b"fifth message",
]
WAIT_S = 30
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


class Failure(Exception):
    """A check that did not hold."""


def env(name, default=None):
    value = os.environ.get(name, default)
    if value is None:
        sys.exit(f"console test: set {name}")
    return value


BASE = env("NARAD_URL").rstrip("/")
USER = env("NARAD_USER")
PASS = env("NARAD_PASS")
SHOTS = env("NARAD_SCREENSHOTS", "./console-screenshots")


def api(method, path, body=None):
    """One API call with Basic auth; returns (status, parsed JSON body or None)."""
    req = urllib.request.Request(BASE + path, data=body, method=method)
    token = base64.b64encode(f"{USER}:{PASS}".encode()).decode()
    req.add_header("Authorization", f"Basic {token}")
    if body is not None:
        req.add_header("Content-Type", "application/octet-stream")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read()
    except urllib.error.URLError as e:
        raise Failure(f"{method} {path}: cannot reach {BASE}: {e.reason}") from e
    try:
        data = json.loads(raw) if raw else None
    except ValueError:
        data = None
    return status, data


def expect(status, data, allowed, what):
    if status not in allowed:
        raise Failure(f"{what}: HTTP {status}, expected {sorted(allowed)}: {data}")


def setup_topic():
    """A fresh `console-demo` with 2 partitions and 5 messages; where the JSON one landed."""
    status, data = api("DELETE", f"/v1/topics/{TOPIC}")
    expect(status, data, {204, 404}, f"delete leftover {TOPIC}")
    status, data = api("PUT", f"/v1/topics/{TOPIC}", json.dumps({"partitions": 2}).encode())
    expect(status, data, {200, 201}, f"create {TOPIC}")
    status, data = api("PUT", f"/v1/topics/{TOPIC}/subscriptions/billing", b"{}")
    expect(status, data, {201}, f"create subscription billing on {TOPIC}")
    landed = {}
    for body in MESSAGES:
        status, data = api("POST", f"/v1/topics/{TOPIC}/produce", body)
        expect(status, data, {201}, f"produce {body[:30]!r}")
        landed[body] = (data["partition"], data["offset"])
    print(f"produced {len(MESSAGES)} messages to {TOPIC}: {sorted(landed.values())}")
    return landed


def browser():
    opts = Options()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                "--disable-gpu", "--window-size=1280,900"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    driver.set_window_size(1280, 900)
    return driver


def css(testid, extra=""):
    return (By.CSS_SELECTOR, f'[data-testid="{testid}"]{extra}')


def wait_for(driver, what, condition):
    """Waits for condition(driver) to be truthy; on timeout, says what and what the page shows."""
    try:
        return WebDriverWait(driver, WAIT_S).until(lambda d: condition(d))
    except TimeoutException:
        shown = [e.text for e in driver.find_elements(*css("error")) if e.is_displayed()]
        hint = f"; the console shows the error: {shown[0]!r}" if shown else ""
        raise Failure(f"timed out after {WAIT_S} s waiting for {what}{hint}") from None


def text_of(driver, locator):
    found = driver.find_elements(*locator)
    return found[0].text if found else None


def shot(driver, name):
    os.makedirs(SHOTS, exist_ok=True)
    path = os.path.join(SHOTS, name)
    driver.save_screenshot(path)
    print(f"saved {path}")


def peek(driver, partition, offset):
    Select(driver.find_element(*css("peek-partition"))).select_by_value(str(partition))
    field = driver.find_element(*css("peek-offset"))
    field.clear()
    field.send_keys(str(offset))
    driver.find_element(*css("peek-open")).click()


def run(driver, landed):
    # b. Sign in and find the topic with its backlog.
    driver.get(BASE + "/console")
    wait_for(driver, "the login form", lambda d: d.find_elements(*css("login-user")))
    driver.find_element(*css("login-user")).send_keys(USER)
    driver.find_element(*css("login-pass")).send_keys(PASS)
    driver.find_element(*css("login-submit")).click()
    wait_for(driver, "the topics table", lambda d: d.find_elements(*css("topics-table")))
    row = css("topic-row", f'[data-topic="{TOPIC}"]')
    backlog = (By.CSS_SELECTOR, f'{row[1]} [data-testid="backlog"]')
    wait_for(driver, f"a row for {TOPIC} with backlog 5",
             lambda d: text_of(d, backlog) == str(len(MESSAGES)))
    shot(driver, "topics.png")

    # c. Open the topic and peek the JSON message where the produce said it landed.
    driver.find_element(By.CSS_SELECTOR, f"{row[1]} a").click()
    wait_for(driver, "the partitions table", lambda d: d.find_elements(*css("partitions-table")))
    # The subscriptions table: billing has every message as its own backlog.
    sub = css("subscription-row", '[data-subscription="billing"]')
    sub_backlog = (By.CSS_SELECTOR, f'{sub[1]} [data-testid="subscription-backlog"]')
    wait_for(driver, f"the billing subscription with backlog {len(MESSAGES)}",
             lambda d: text_of(d, sub_backlog) == str(len(MESSAGES)))
    shot(driver, "topic.png")
    partition, offset = landed[json.dumps(JSON_MESSAGE).encode()]
    peek(driver, partition, offset)
    wait_for(driver, f'the peeked message (partition {partition}, offset {offset}) to show "hello"',
             lambda d: '"hello"' in (text_of(d, css("peek-message")) or ""))
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'})",
                          driver.find_element(*css("peek-message")))
    shown = driver.find_element(*css("peek-payload")).text
    if json.loads(shown) != JSON_MESSAGE:
        raise Failure(f"peeked payload is {shown!r}, expected {JSON_MESSAGE}")
    shot(driver, "message.png")

    # Payloads are shown as text, never as markup.
    partition, offset = landed[HTML_LOOKALIKE.encode()]
    peek(driver, partition, offset)
    wait_for(driver, "the HTML-lookalike message",
             lambda d: text_of(d, css("peek-payload")) == HTML_LOOKALIKE)
    if driver.find_elements(By.CSS_SELECTOR, '[data-testid="peek-message"] b, [data-testid="peek-message"] script'):
        raise Failure("a payload was rendered as HTML")


def check_nothing_leased():
    # d. The console only replays: nothing in flight, all 5 messages still available.
    status, data = api("GET", f"/v1/topics/{TOPIC}")
    expect(status, data, {200}, f"get {TOPIC}")
    parts = data.get("partitions") or []
    leased = {p["partition"]: p["in_flight"] for p in parts if p["in_flight"] != 0}
    if leased:
        raise Failure(f"the console leased messages: in_flight per partition {leased}")
    available = sum(p["available"] for p in parts)
    if available != len(MESSAGES):
        raise Failure(f"available is {available} after the test, expected {len(MESSAGES)}")
    status, data = api("GET", f"/v1/topics/{TOPIC}/subscriptions/billing")
    expect(status, data, {200}, "get subscription billing")
    if sum(p["in_flight"] for p in data["partitions"]) != 0:
        raise Failure(f"the console leased messages of billing: {data}")


def main():
    driver = None
    try:
        landed = setup_topic()
        driver = browser()
        run(driver, landed)
        check_nothing_leased()
    except Exception as e:  # noqa: BLE001 — any failure ends the test the same way
        reason = str(e) if isinstance(e, Failure) else f"{type(e).__name__}: {e}"
        if driver is not None:
            try:
                shot(driver, "failure.png")
                for entry in driver.get_log("browser"):
                    print(f"browser console: {entry.get('level')} {entry.get('message')}", file=sys.stderr)
            except Exception as shot_error:  # noqa: BLE001
                print(f"(could not save failure.png: {shot_error})", file=sys.stderr)
        print(f"CONSOLE TEST FAILED: {reason}", file=sys.stderr)
        return 1
    finally:
        if driver is not None:
            driver.quit()
    print("console test passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
