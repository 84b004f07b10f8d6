"""Drives the memory console (retrieval-svc/src/api/console) in a real
headless Chromium through its WebDriver, as a person would: sign in with a
key, search, open a memory and its versions, confirm a conflict, then try
another tenant's data. Run by tests/console.rs against a real stack.

Usage: console_probe.py CONFIG_JSON
CONFIG_JSON: {"base", "key_a", "key_b", "edited_id", "first_text",
              "other_id", "other_text", "shots", "chromium", "driver"}
Exits non-zero with the failed check on stderr; prints one line per check.
"""

import json
import os
import shutil
import sys
import urllib.request

sys.dont_write_bytecode = True
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

WAIT = 30


def browser(cfg):
    opts = webdriver.ChromeOptions()
    opts.binary_location = cfg["chromium"]
    for arg in ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                "--disable-gpu", "--window-size=1280,1600", "--no-first-run",
                "--disable-extensions", "--disable-background-networking"]:
        opts.add_argument(arg)
    return webdriver.Chrome(service=Service(executable_path=cfg["driver"]), options=opts)


class Probe:
    def __init__(self, cfg):
        self.cfg = cfg
        self.d = browser(cfg)
        self.shot_n = 0

    def check(self, ok, what):
        if not ok:
            self.shot("failed")
            err = self.text("error") if self.visible("error") else ""
            raise SystemExit(f"console check failed: {what} (page error: {err!r})")
        print(f"ok: {what}", flush=True)

    def shot(self, name):
        self.shot_n += 1
        os.makedirs(self.cfg["shots"], exist_ok=True)
        self.d.save_screenshot(os.path.join(self.cfg["shots"], f"{self.shot_n:02d}-{name}.png"))

    def el(self, css):
        return self.d.find_element(By.CSS_SELECTOR, css)

    def all(self, css):
        return self.d.find_elements(By.CSS_SELECTOR, css)

    def text(self, id_):
        return self.d.find_element(By.ID, id_).text

    def visible(self, id_):
        return self.d.find_element(By.ID, id_).is_displayed()

    def until(self, cond, what):
        """Waits for `cond`; an element the page redrew while it was read
        is another try, not a failure."""
        def tried(_d):
            try:
                return cond()
            except StaleElementReferenceException:
                return False
        try:
            WebDriverWait(self.d, WAIT).until(tried)
        except TimeoutException:
            self.check(False, f"waited {WAIT} s for {what}")

    def sign_in(self, key):
        box = self.el("#key")
        box.clear()
        box.send_keys(key)
        self.el("#login-btn").click()
        self.until(lambda: self.visible("app") and self.text("tenant"), "the signed-in view")
        self.until(lambda: "memories" in self.text("counts"), "the tenant's counts")

    def search(self, text):
        box = self.el("#q")
        box.clear()
        box.send_keys(text)
        before = self.text("route-line")
        self.el("#search-btn").click()
        self.until(lambda: self.visible("answer") and self.text("route-line") != before,
                   f"an answer to {text!r}")
        return [r.text for r in self.all("#results tr.record")]

    def open_id(self, id_):
        box = self.el("#memory-id")
        box.clear()
        box.send_keys(id_)
        self.el("#open-btn").click()

    def sign_out(self):
        self.el("#logout").click()
        self.until(lambda: self.visible("login"), "the sign-in form again")


def headers(url, key=None):
    req = urllib.request.Request(url)
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    with urllib.request.urlopen(req, timeout=10) as resp:
        return resp.headers


def main():
    cfg = json.loads(sys.argv[1])
    shutil.rmtree(cfg["shots"], ignore_errors=True)  # this run's pictures only
    base = cfg["base"]
    page = headers(base + "/console")
    policy = page.get("Content-Security-Policy", "")
    assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy, policy
    answer = headers(f"{base}/v1/memories/{cfg['edited_id']}", cfg["key_a"])
    assert answer.get("Cache-Control") == "no-store", dict(answer)
    print("ok: the page forbids inline scripts and frames; API answers are no-store")

    p = Probe(cfg)
    try:
        p.d.get(base + "/console")
        p.check(p.visible("login") and not p.visible("app"), "the console opens at sign-in")
        p.el("#key").send_keys("k-not-a-key")
        p.el("#login-btn").click()
        p.until(lambda: p.visible("error"), "a message for a wrong key")
        p.check(not p.visible("app"), "a wrong key is refused")
        run(p, cfg)
    finally:
        p.d.quit()


def run(p, cfg):
    p.sign_in(cfg["key_a"])
    p.shot("signed-in")
    counts = p.text("counts")
    p.check("memories" in counts and "conflicts awaiting review" in counts, "per-tenant counts")

    rows = p.search("Where does Priya live now?")
    p.shot("search")
    p.check(any("Amsterdam" in r for r in rows), "the search finds the current fact")
    p.check(any("@" in t.text for t in p.all("#results .tag")), "explain draws strategy @ rank")
    p.check(p.text("context").strip() not in ("", "(no context block)"), "the context block is shown")
    p.check(len(p.all("#stages tr")) > 0, "stage timings are drawn")

    p.all("#results tr.record .open-memory")[0].click()
    p.until(lambda: p.visible("memory-view") and p.text("m-content"), "a memory opened from the answer")
    p.check(len(p.all("#m-history li")) >= 1, "a memory's versions are listed")

    p.open_id(cfg["edited_id"])
    p.until(lambda: cfg["first_text"] in p.text("m-history"), "the edited memory's first version")
    p.shot("memory")
    p.check(len(p.all("#m-history li")) == 2, "an edit in place shows two versions")
    p.until(lambda: p.all("#m-neighbours li"), "graph neighbours drawn")

    p.until(lambda: p.all("#conflicts-list tr.conflict"), "a detected conflict in the queue")
    p.shot("conflicts")
    waiting = lambda: p.text("conflicts-waiting").strip()
    p.until(lambda: waiting().rstrip("+").isdigit(), "the count of conflicts awaiting review")
    before = int(waiting().rstrip("+"))
    p.check(before == len(p.all("#conflicts-list tr.conflict")), "the count is the queue's length")
    row = p.all("#conflicts-list tr.conflict")[0]
    pair = (row.get_attribute("data-new"), row.get_attribute("data-old"))
    row.find_element(By.CSS_SELECTOR, "button.confirm").click()
    gone = lambda: all((r.get_attribute("data-new"), r.get_attribute("data-old")) != pair
                       for r in p.all("#conflicts-list tr.conflict"))
    p.until(gone, "the confirmed pair to leave the queue")
    p.until(lambda: waiting() == str(before - 1), "the count to follow the queue")
    p.check(not p.visible("error"), "confirming a conflict succeeds")

    # Another tenant's memory: not found by search, not opened by id.
    rows = p.search(cfg["other_text"])
    p.check(not any(cfg["other_text"] in r for r in rows), "another tenant's memory is not found")
    p.open_id(cfg["other_id"])
    p.until(lambda: p.visible("error"), "an error for another tenant's id")
    p.check("no memory" in p.text("error"), "another tenant's memory is not opened")
    p.shot("cross-tenant")

    p.sign_out()
    p.check(not p.all("#results tr.record"), "signing out clears the answer")
    p.sign_in(cfg["key_b"])
    rows = p.search(cfg["other_text"])
    p.check(any(cfg["other_text"] in r for r in rows), "the owner's key finds its own memory")
    p.check(not p.all("#conflicts-list tr.conflict"), "the owner sees none of the other tenant's conflicts")
    p.shot("other-tenant")


if __name__ == "__main__":
    main()
