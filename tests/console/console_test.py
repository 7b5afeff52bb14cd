#!/usr/bin/env python3
"""Browser test of the Narad web console (`/console`), headless Chromium through Selenium.

Environment:
  NARAD_URL            broker base URL, e.g. http://127.0.0.1:8080 or https://x/prod (required)
  NARAD_USER           a user with every right (required)
  NARAD_PASS           its password (required)
  NARAD_LIMITED_USER   a user whose only grant is `consume` on `console-demo` (required)
  NARAD_LIMITED_PASS   its password (required)
  NARAD_SCREENSHOTS    where to write the screenshots (default ./console-screenshots)

Steps, each in Chromium:
  a. API setup: `console-demo` (2 partitions, 5 messages, subscription `billing`); and
     `console-orders` (max_deliveries 1, dead-letter topic `console-orders-dlq`) whose 3
     messages are nacked until they are dead letters.
  b. Sign in; the topic list shows console-demo's backlog; peek a JSON message and an
     HTML-lookalike one (text, never markup).
  c. Create topic `console-charts` through the dialog (first a conflicting create, whose
     409 message the dialog shows).
  d. Traffic on console-charts (produce and ack through the API): the topic page's three
     SVG charts and the list's sparkline fill with several changing samples.
  e. Pause, resume, purge console-charts through their dialogs; each checked through the API.
  f. The dead-letter view of console-orders-dlq shows each message's origin headers;
     redrive moves them back to console-orders.
  g. Delete topic `console-scratch` through its dialog (typing the name).
  h. The console leased nothing of console-demo.
  i. The limited user: sees console-demo only, no admin or produce controls, and the
     server answers 403 to its admin calls, from the page and from here.
  j. A server without /v1/whoami (the page's fetch answers it 404, as a build before it
     does): every action is offered, the page says why, and a purge shows the server's 403
     in its dialog.

Screenshots: topics.png, message.png, dialog-create.png, topic.png (charts with data),
dialog-pause.png, dialog-purge.png, dlq.png, dialog-redrive.png, dialog-delete.png,
limited-user.png, older-server-403.png; failure.png when it fails. Exits 1 with a message on failure.

Setup: pip install -r tests/console/requirements.txt; apt-get install chromium chromium-driver.
"""

import base64
import json
import os
import sys
import threading
import time
import urllib.error
import urllib.request

from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait

TOPIC = "console-demo"
CHARTS = "console-charts"
ORDERS = "console-orders"
DLQ = "console-orders-dlq"
SCRATCH = "console-scratch"
DEAD_LETTERS = 3
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
CHART_POINTS = 8  # points each chart must show before topic.png (one per 2 s sample)
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
LIMITED_USER = env("NARAD_LIMITED_USER")
LIMITED_PASS = env("NARAD_LIMITED_PASS")
SHOTS = env("NARAD_SCREENSHOTS", "./console-screenshots")


# ---- The API, from here ------------------------------------------------------------------

def api(method, path, body=None, *, user=USER, password=PASS, headers=None):
    """One API call with Basic auth; returns (status, parsed JSON body or None). A dict or
    list body is sent as JSON."""
    if isinstance(body, (dict, list)):
        body = json.dumps(body).encode()
    req = urllib.request.Request(BASE + path, data=body, method=method)
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    req.add_header("Authorization", f"Basic {token}")
    if body is not None:
        req.add_header("Content-Type", "application/octet-stream")
    for k, v in (headers or {}).items():
        req.add_header(k, v)
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


def fresh_topic(name, settings):
    status, data = api("DELETE", f"/v1/topics/{name}")
    expect(status, data, {204, 404}, f"delete leftover {name}")
    status, data = api("PUT", f"/v1/topics/{name}", settings)
    expect(status, data, {201}, f"create {name}")


def stats(name):
    """GET /v1/topics/{name}: (settings, {available, in_flight, unsettled} summed)."""
    status, data = api("GET", f"/v1/topics/{name}")
    expect(status, data, {200}, f"get {name}")
    parts = data.get("partitions") or []
    total = {k: sum(p[k] for p in parts) for k in ("available", "in_flight")}
    total["unsettled"] = sum(p["next_offset"] - p["frontier"] - p["acked_ahead"] for p in parts)
    return data["settings"], total


def eventually(what, check, timeout=WAIT_S):
    """Polls check() (truthy when done) for up to timeout seconds."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise Failure(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.3)


def setup_topic():
    """A fresh `console-demo` with 2 partitions and 5 messages; where each landed."""
    fresh_topic(TOPIC, {"partitions": 2})
    status, data = api("PUT", f"/v1/topics/{TOPIC}/subscriptions/billing", b"{}")
    expect(status, data, {201}, f"create subscription billing on {TOPIC}")
    landed = {}
    for body in MESSAGES:
        status, data = api("POST", f"/v1/topics/{TOPIC}/produce", body)
        expect(status, data, {201}, f"produce {body[:30]!r}")
        landed[body] = (data["partition"], data["offset"])
    print(f"produced {len(MESSAGES)} messages to {TOPIC}: {sorted(landed.values())}")
    return landed


def consume_batch(name, n):
    status, data = api("GET", f"/v1/topics/{name}/consume?max={n}")
    expect(status, data, {200, 204}, f"consume {name}")
    return [m["receipt_handle"] for m in (data or {}).get("messages", [])]


def settle(name, handles, nack=False):
    body = {"receipt_handles": handles}
    if nack:
        body["extend"] = 0
    status, data = api("POST", f"/v1/topics/{name}/ack", body)
    expect(status, data, {200}, f"{'nack' if nack else 'ack'} {len(handles)} on {name}")


def setup_dead_letters():
    """`console-orders` with max_deliveries 1 whose messages are nacked into `console-orders-dlq`."""
    fresh_topic(DLQ, {})
    fresh_topic(ORDERS, {"max_deliveries": 1, "dead_letter_topic": DLQ})
    for i in range(DEAD_LETTERS):
        status, data = api("POST", f"/v1/topics/{ORDERS}/produce", f'{{"order":{i}}}'.encode(),
                           headers={"Narad-Header-Order-Id": f"order-{i}"})
        expect(status, data, {201}, f"produce order {i}")

    def dead_lettered():
        handles = consume_batch(ORDERS, 10)
        if handles:
            settle(ORDERS, handles, nack=True)
        return stats(DLQ)[1]["available"] >= DEAD_LETTERS

    eventually(f"{DEAD_LETTERS} dead letters in {DLQ}", dead_lettered)
    print(f"{DEAD_LETTERS} messages of {ORDERS} dead-lettered into {DLQ}")


class Traffic(threading.Thread):
    """Every 0.4 s, produces a batch and consumes and acks a few, in phases of changing
    rates, until stopped: the charts' data. It holds no lease when it stops."""

    def __init__(self, name):
        super().__init__(daemon=True)
        self.name_ = name
        self.stop = threading.Event()
        self.error = None
        self.round = 0

    def run(self):
        try:
            while not self.stop.is_set():
                self.round += 1
                phase = (self.round // 6) % 3  # about 2.5 s each
                produce, ack = ((4, 2), (14, 5), (8, 10))[phase]
                batch = {"messages": [{"payload": {"round": self.round, "i": i}} for i in range(produce)]}
                status, data = api("POST", f"/v1/topics/{self.name_}/produce-batch", batch)
                expect(status, data, {200}, "produce-batch")
                handles = consume_batch(self.name_, ack)
                if handles:
                    settle(self.name_, handles)
                time.sleep(0.4)
        except Exception as e:  # noqa: BLE001 — reported by finish()
            self.error = e

    def finish(self):
        self.stop.set()
        self.join(timeout=30)
        if self.error:
            raise Failure(f"traffic on {self.name_}: {self.error}")


# ---- The browser -------------------------------------------------------------------------

def browser():
    opts = Options()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                "--disable-gpu", "--window-size=1280,900", "--force-prefers-reduced-motion"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    driver.set_window_size(1280, 900)
    return driver


def css(testid, extra=""):
    return (By.CSS_SELECTOR, f'[data-testid="{testid}"]{extra}')


def within(parent_testid, testid):
    return (By.CSS_SELECTOR, f'[data-testid="{parent_testid}"] [data-testid="{testid}"]')


def wait_for(driver, what, condition, timeout=WAIT_S):
    """Waits for condition(driver) to be truthy; on timeout, says what and what the page shows."""
    try:
        return WebDriverWait(driver, timeout, ignored_exceptions=(StaleElementReferenceException,)).until(
            lambda d: condition(d))
    except TimeoutException:
        shown = [e.text for e in driver.find_elements(*css("error")) if e.is_displayed()]
        hint = f"; the console shows the error: {shown[0]!r}" if shown else ""
        raise Failure(f"timed out after {timeout} s waiting for {what}{hint}") from None


def text_of(driver, locator):
    try:
        found = driver.find_elements(*locator)
        return found[0].text if found else None
    except StaleElementReferenceException:
        return None


def click(driver, locator, what):
    """Clicks the element once it is there (the page redraws its stats every few seconds)."""
    def clicked(d):
        found = d.find_elements(*locator)
        if not found:
            return False
        found[0].click()
        return True
    wait_for(driver, what, clicked)


def shot(driver, name):
    os.makedirs(SHOTS, exist_ok=True)
    path = os.path.join(SHOTS, name)
    driver.save_screenshot(path)
    print(f"saved {path}")


def go(driver, hash_):
    driver.execute_script("location.hash = arguments[0]", hash_)


def open_topic(driver, name):
    go(driver, f"#/topics/{name}")
    wait_for(driver, f"the page of {name}",
             lambda d: text_of(d, css("topic-name")) == name and d.find_elements(*css("partitions-table")))


def dialog(driver, testid, screenshot=None, fill=None):
    """Waits for the dialog, fills it (fill(driver)), optionally saves a screenshot, confirms,
    and waits for it to close."""
    wait_for(driver, f"the {testid} dialog", lambda d: any(e.is_displayed() for e in d.find_elements(*css(testid))))
    if fill:
        fill(driver)
    if screenshot:
        shot(driver, screenshot)
    driver.find_element(*within(testid, "dialog-confirm")).click()
    wait_for(driver, f"the {testid} dialog to close", lambda d: not d.find_elements(*css(testid)))


def refused(driver, testid, contains, fill=None, screenshot=None):
    """Waits for the dialog, fills it, confirms, waits for the server's refusal (`contains`)
    shown in it, optionally saves a screenshot, cancels, and answers the text shown."""
    wait_for(driver, f"the {testid} dialog", lambda d: any(e.is_displayed() for e in d.find_elements(*css(testid))))
    if fill:
        fill(driver)
    driver.find_element(*within(testid, "dialog-confirm")).click()
    wait_for(driver, f"the {testid} dialog to show {contains!r}",
             lambda d: contains in (text_of(d, within(testid, "dialog-error")) or ""))
    if screenshot:
        shot(driver, screenshot)
    shown = text_of(driver, within(testid, "dialog-error"))
    driver.find_element(*within(testid, "dialog-cancel")).click()
    wait_for(driver, f"the {testid} dialog to close", lambda d: not d.find_elements(*css(testid)))
    return shown


def notice(driver, what, contains):
    wait_for(driver, f"the notice {contains!r}", lambda d: contains in (text_of(d, css("notice")) or ""))
    print(f"{what}: {text_of(driver, css('notice-text'))}")


def sign_in(driver, user, password):
    driver.get(BASE + "/console")
    wait_for(driver, "the login form", lambda d: d.find_elements(*css("login-user")))
    driver.find_element(*css("login-user")).send_keys(user)
    driver.find_element(*css("login-pass")).send_keys(password)
    driver.find_element(*css("login-submit")).click()
    wait_for(driver, "the topics table", lambda d: d.find_elements(*css("topics-table")))
    wait_for(driver, f"'Signed in as {user}'", lambda d: user in (text_of(d, css("who")) or ""))


def peek(driver, partition, offset):
    Select(driver.find_element(*css("peek-partition"))).select_by_value(str(partition))
    field = driver.find_element(*css("peek-offset"))
    field.clear()
    field.send_keys(str(offset))
    driver.find_element(*css("peek-open")).click()


def topic_row(name, testid=None):
    row = f'[data-testid="topic-row"][data-topic="{name}"]'
    return (By.CSS_SELECTOR, f'{row} [data-testid="{testid}"]' if testid else row)


# ---- The steps ---------------------------------------------------------------------------

def browse_demo(driver, landed):
    """b. The list with console-demo's backlog; its page; peeks."""
    wait_for(driver, f"a row for {TOPIC} with backlog 5",
             lambda d: text_of(d, topic_row(TOPIC, "backlog")) == str(len(MESSAGES)))
    driver.find_element(By.CSS_SELECTOR, f'{topic_row(TOPIC)[1]} a').click()
    wait_for(driver, "the partitions table", lambda d: d.find_elements(*css("partitions-table")))
    sub_backlog = (By.CSS_SELECTOR, '[data-subscription="billing"] [data-testid="subscription-backlog"]')
    wait_for(driver, f"the billing subscription with backlog {len(MESSAGES)}",
             lambda d: text_of(d, sub_backlog) == str(len(MESSAGES)))
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


def create_topic(driver):
    """c. The create dialog: a conflict shows the server's message, then a real create."""
    go(driver, "#/")
    click(driver, css("action-create"), "the New topic button")

    def conflicting(d):
        d.find_element(*css("create-name")).send_keys(TOPIC)
        field = d.find_element(*css("create-partitions"))
        field.clear()
        field.send_keys("3")
    print(f"conflicting create: {refused(driver, 'dialog-create', '409', conflicting)}")
    if api("GET", f"/v1/topics/{TOPIC}")[1]["settings"]["partitions"] != 2:
        raise Failure(f"the conflicting create changed {TOPIC}")

    status, _ = api("DELETE", f"/v1/topics/{CHARTS}")
    click(driver, css("action-create"), "the New topic button")

    def fill(d):
        d.find_element(*css("create-name")).send_keys(CHARTS)
        field = d.find_element(*css("create-partitions"))
        field.clear()
        field.send_keys("2")
        d.find_element(*css("create-visibility")).send_keys("60000")
    dialog(driver, "dialog-create", "dialog-create.png", fill)
    notice(driver, "create", f"Created topic {CHARTS}")
    wait_for(driver, f"the page of {CHARTS}", lambda d: text_of(d, css("topic-name")) == CHARTS)
    settings, _ = stats(CHARTS)
    if settings["partitions"] != 2 or settings["visibility_timeout_ms"] != 60000:
        raise Failure(f"{CHARTS} was created with {settings}")


def chart_points(driver):
    """Per chart testid: the y coordinates of its polyline."""
    return driver.execute_script("""
        const out = {};
        for (const svg of document.querySelectorAll('[data-testid="charts"] svg')) {
          const pts = (svg.querySelector('polyline')?.getAttribute('points') || '').trim();
          out[svg.dataset.testid] = pts ? pts.split(/\\s+/).map((p) => Number(p.split(',')[1])) : [];
        }
        return out;""")


def charts(driver):
    """d. Traffic through the API; the charts fill with changing samples; so does the list's sparkline."""
    traffic = Traffic(CHARTS)
    traffic.start()
    try:
        def filled(d):
            ys = chart_points(d)
            need = ("chart-produced", "chart-acked", "chart-backlog")
            return all(len(ys.get(k, [])) >= CHART_POINTS for k in need) and \
                len(set(ys["chart-produced"])) > 1 and len(set(ys["chart-backlog"])) > 1 and \
                min(ys["chart-acked"]) < max(ys["chart-acked"])
        wait_for(driver, f"three charts with {CHART_POINTS}+ changing points", filled, timeout=60)
        for k, ys in chart_points(driver).items():
            print(f"{k}: {len(ys)} points, now {text_of(driver, css(k + '-now'))}")
        if text_of(driver, css("chart-produced-now")) in ("0", "—"):
            raise Failure("the produce rate reads 0 during traffic")
        shot(driver, "topic.png")

        click(driver, (By.CSS_SELECTOR, '.crumbs a'), "the Topics link")
        spark = (By.CSS_SELECTOR, f'{topic_row(CHARTS)[1]} svg[data-testid="sparkline"] polyline')
        wait_for(driver, f"a sparkline for {CHARTS}", lambda d: d.find_elements(*spark))
        wait_for(driver, f"a row for {TOPIC} with backlog 5",
                 lambda d: text_of(d, topic_row(TOPIC, "backlog")) == str(len(MESSAGES)))
        shot(driver, "topics.png")
    finally:
        traffic.finish()


def pause_resume_purge(driver):
    """e. Pause, resume and purge console-charts, each confirmed and checked through the API."""
    open_topic(driver, CHARTS)
    click(driver, css("action-pause"), "the Pause button")
    dialog(driver, "dialog-pause", "dialog-pause.png")
    notice(driver, "pause", f"Paused {CHARTS}")
    eventually("paused: true", lambda: stats(CHARTS)[0]["paused"] is True)
    wait_for(driver, "the paused badge", lambda d: d.find_elements(*css("paused-badge")))

    click(driver, css("action-resume"), "the Resume button")
    dialog(driver, "dialog-resume")
    notice(driver, "resume", f"Resumed {CHARTS}")
    eventually("paused: false", lambda: stats(CHARTS)[0]["paused"] is False)

    if stats(CHARTS)[1]["available"] == 0:
        raise Failure(f"{CHARTS} has no backlog to purge")
    click(driver, css("action-purge"), "the Purge button")
    dialog(driver, "dialog-purge", "dialog-purge.png")
    notice(driver, "purge", "Purged")
    _, total = stats(CHARTS)
    if total["available"] != 0 or total["in_flight"] != 0 or total["unsettled"] != 0:
        raise Failure(f"after the purge {CHARTS} holds {total}")
    wait_for(driver, "backlog 0 on the page", lambda d: text_of(d, css("total-backlog")) == "0")


def dead_letters(driver):
    """f. The dead-letter view shows the origin headers; redrive moves the messages back."""
    open_topic(driver, DLQ)
    wait_for(driver, f"the page to say it is the dead-letter topic of {ORDERS}",
             lambda d: f"the dead-letter topic of {ORDERS}" in (text_of(d, css("topic-meta")) or ""))
    rows = css("dead-letter-row")
    wait_for(driver, f"{DEAD_LETTERS} dead letters", lambda d: len(d.find_elements(*rows)) == DEAD_LETTERS)
    for row in driver.find_elements(*rows):
        def cell(testid, row=row):
            return row.find_element(*css(testid)).text
        if cell("dl-source-topic") != ORDERS:
            raise Failure(f"a dead letter's source topic shows {cell('dl-source-topic')!r}")
        position = cell("dl-source-position").split(" / ")
        if len(position) != 2 or not all(x.isdigit() for x in position):
            raise Failure(f"a dead letter's source position shows {cell('dl-source-position')!r}")
        if not cell("dl-delivery-count").isdigit() or not cell("dl-dead-lettered-at").startswith("20"):
            raise Failure(f"a dead letter's origin headers show {row.text!r}")
        if "order-id" not in row.text:
            raise Failure(f"a dead letter's own header is missing: {row.text!r}")
    driver.execute_script("window.scrollTo(0, 0)")
    shot(driver, "dlq.png")

    click(driver, css("action-redrive"), "the Redrive button")
    dialog(driver, "dialog-redrive", "dialog-redrive.png")
    notice(driver, "redrive", f"{DEAD_LETTERS} moved back")
    eventually(f"{DEAD_LETTERS} messages back in {ORDERS}", lambda: stats(ORDERS)[1]["available"] == DEAD_LETTERS)
    if stats(DLQ)[1]["unsettled"] != 0:
        raise Failure(f"{DLQ} still holds dead letters after the redrive: {stats(DLQ)[1]}")
    wait_for(driver, "the dead-letter view to empty", lambda d: not d.find_elements(*rows))


def delete_topic(driver):
    """g. Delete a topic through its dialog, typing its name."""
    fresh_topic(SCRATCH, {})
    open_topic(driver, SCRATCH)
    click(driver, css("action-delete"), "the Delete button")
    dialog(driver, "dialog-delete", "dialog-delete.png",
           lambda d: d.find_element(*css("delete-confirm-name")).send_keys(SCRATCH))
    notice(driver, "delete", f"Deleted topic {SCRATCH}")
    status, data = api("GET", f"/v1/topics/{SCRATCH}")
    expect(status, data, {404}, f"get {SCRATCH} after the delete")
    wait_for(driver, "the topic list without it",
             lambda d: d.find_elements(*css("topics-table")) and not d.find_elements(*topic_row(SCRATCH)))


def check_nothing_leased():
    """h. The console only replays: nothing in flight, all 5 messages still available."""
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


def limited_user(driver):
    """i. A user with `consume` on console-demo only: no admin or produce controls; 403s."""
    status, data = api("GET", "/v1/whoami", user=LIMITED_USER, password=LIMITED_PASS)
    expect(status, data, {200}, "whoami as the limited user")
    print(f"whoami as {LIMITED_USER}: {data}")

    click(driver, css("sign-out"), "Sign out")
    sign_in(driver, LIMITED_USER, LIMITED_PASS)
    wait_for(driver, f"a row for {TOPIC}", lambda d: d.find_elements(*topic_row(TOPIC)))
    shown = [e.get_attribute("data-topic") for e in driver.find_elements(*css("topic-row"))]
    if shown != [TOPIC]:
        raise Failure(f"the limited user's list shows {shown}, expected [{TOPIC!r}]")
    if driver.find_elements(*css("action-create")):
        raise Failure("the limited user is offered New topic")

    open_topic(driver, TOPIC)
    wait_for(driver, "the peek form", lambda d: d.find_elements(*css("peek-open")))
    wait_for(driver, "the actions drawn", lambda d: d.find_elements(*css("topic-actions", "[data-ready]")))
    offered = [e.get_attribute("data-testid") for e in driver.find_elements(By.CSS_SELECTOR, '[data-testid^="action-"]')]
    if offered:
        raise Failure(f"the limited user is offered {offered}")
    if driver.find_elements(*css("produce-form")):
        raise Failure("the limited user is offered the produce form")
    shot(driver, "limited-user.png")

    # The server refuses what the buttons would have done: from the page, with its credentials...
    answers = driver.execute_async_script("""
        const done = arguments[arguments.length - 1];
        const auth = 'Basic ' + btoa(sessionStorage.getItem('narad.user') + ':' + sessionStorage.getItem('narad.pass'));
        const base = location.pathname.replace(/\\/console(?:\\/.*)?$/, '');
        const call = (method, path, body) => fetch(base + path, {method, body, headers: {Authorization: auth}})
          .then((r) => r.status);
        Promise.all([
          call('POST', '/v1/topics/console-demo/purge'),
          call('PATCH', '/v1/topics/console-demo', '{"paused":true}'),
          call('DELETE', '/v1/topics/console-demo'),
          call('POST', '/v1/topics/console-orders-dlq/redrive'),
          call('PUT', '/v1/topics/console-new', '{}'),
          call('POST', '/v1/topics/console-demo/produce', 'x'),
        ]).then(done, (e) => done(String(e)));""")
    if answers != [403] * 6:
        raise Failure(f"the limited user's admin and produce calls from the page got {answers}, expected 403s")
    # ... and from here.
    status, data = api("POST", f"/v1/topics/{TOPIC}/purge", user=LIMITED_USER, password=LIMITED_PASS)
    expect(status, data, {403}, "purge as the limited user")
    print(f"the limited user's calls got 403: {data}")
    if stats(TOPIC)[0]["paused"] or stats(TOPIC)[1]["available"] != len(MESSAGES):
        raise Failure(f"the limited user changed {TOPIC}")


def older_server(driver):
    """j. A server without /v1/whoami (a build before it, met during a rolling deploy): the
    page offers every action, says why, and the server's 403 decides, shown in the dialog."""
    # Every page load from now on answers /v1/whoami as such a server does: 404 route_not_found.
    driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": """
        const realFetch = window.fetch.bind(window);
        window.fetch = (input, init) => String(input).endsWith('/v1/whoami')
          ? Promise.resolve(new Response(
              JSON.stringify({error: {code: 'route_not_found', message: 'no such route'}}),
              {status: 404, headers: {'Content-Type': 'application/json'}}))
          : realFetch(input, init);"""})
    click(driver, css("sign-out"), "Sign out")
    sign_in(driver, LIMITED_USER, LIMITED_PASS)
    wait_for(driver, "New topic offered", lambda d: d.find_elements(*css("action-create")))
    title = driver.find_element(*css("who")).get_attribute("title") or ""
    if "no /v1/whoami" not in title:
        raise Failure(f"the signed-in line's title does not say why every action shows: {title!r}")
    open_topic(driver, TOPIC)
    wait_for(driver, "the actions drawn", lambda d: d.find_elements(*css("topic-actions", "[data-ready]")))
    offered = {e.get_attribute("data-testid") for e in driver.find_elements(By.CSS_SELECTOR, '[data-testid^="action-"]')}
    if not {"action-pause", "action-purge", "action-delete"} <= offered:
        raise Failure(f"without whoami the page offers only {sorted(offered)}")
    status, answer = api("POST", f"/v1/topics/{TOPIC}/purge", user=LIMITED_USER, password=LIMITED_PASS)
    expect(status, answer, {403}, "purge as the limited user")
    click(driver, css("action-purge"), "the Purge button")
    shown = refused(driver, "dialog-purge", answer["error"]["message"], screenshot="older-server-403.png")
    print(f"without whoami, the purge button was offered and the dialog says: {shown}")
    if stats(TOPIC)[0]["paused"] or stats(TOPIC)[1]["available"] != len(MESSAGES):
        raise Failure(f"the limited user changed {TOPIC}")


def run(driver, landed):
    sign_in(driver, USER, PASS)
    browse_demo(driver, landed)
    create_topic(driver)
    charts(driver)
    pause_resume_purge(driver)
    dead_letters(driver)
    delete_topic(driver)
    check_nothing_leased()
    limited_user(driver)
    older_server(driver)
    check_nothing_leased()


def main():
    driver = None
    try:
        landed = setup_topic()
        setup_dead_letters()
        driver = browser()
        run(driver, landed)
        # Refused requests (the 409 and 403s above) are logged as failed loads: not errors.
        errors = [e for e in driver.get_log("browser") if e.get("level") == "SEVERE"
                  and "Failed to load resource" not in e.get("message", "")]
        if errors:
            raise Failure(f"the browser logged errors: {errors}")
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
