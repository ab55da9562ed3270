"""The admin console (/admin/ui) in a real headless Chromium, driven by Selenium, against a real gateway
process in front of four simulators (2 vLLM-dialect, 2 SGLang-dialect).

Every browser test checks the console's effect through the REST API or the data path, not through the
page alone: a weight set in the console is in `GET /admin/pools` and moves traffic (`x-gateway-pool`),
a drain shows in `GET /admin/pools`, a key created in the console answers on /v1/chat/completions and
is refused once revoked there, the audit log lists the console's changes. One browser and one gateway
for the module. A screenshot of each screen goes to artifacts/console/ (git-ignored; the path is
printed at the end). Chromium and chromedriver are Debian's (scripts/ensure-services.sh installs
them); when they are missing the tests fail, never skip.
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import re
import shutil
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import Select, WebDriverWait

from gateway.admission.tokens import mint_token
from gateway.control.console import CSP, Console
from gateway.demo import SERVED, demo_config
from tests.conftest import MODEL, fast_sim
from tests.support import HTTP, GatewayProcess

pytestmark = pytest.mark.processes

ROOT = Path(__file__).resolve().parents[3]
ASSETS = ROOT / "gateway" / "control" / "ui"
SHOTS = ROOT / "artifacts" / "console"
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"

SECRET = "console-test-secret-0123456789abcdef"
ENV = {"GATEWAY_JWT_SECRET": SECRET}
ADMIN_TOKEN = mint_token(SECRET, "ops", roles=["admin"])
ADMIN = {"Authorization": "Bearer " + ADMIN_TOKEN}
USER_TOKEN = mint_token(SECRET, "alice")
USER = {"Authorization": "Bearer " + USER_TOKEN}


def _config(urls: dict[str, list[str]]) -> dict[str, Any]:
    """The demo's two pools (weights 0.5 each, tools and long prompts to SGLang), quick probes, no
    rate limits (the model has the demo's price, so spend is in dollars)."""
    config = demo_config(urls, port=0)
    config.pop("limits")
    config["models"][0]["name"] = MODEL
    for pool in config["pools"]:
        pool["models"] = {MODEL: SERVED[pool["dialect"]]}
    config["routing"]["scrape_interval_s"] = 0.5
    config["upstream"]["health"]["interval_s"] = 0.5
    return config


@pytest.fixture(scope="module")
def gateway() -> Iterator[GatewayProcess]:
    with contextlib.ExitStack() as stack:
        urls = {e: [stack.enter_context(fast_sim(e)).base_url for _ in range(2)] for e in ("vllm", "sglang")}
        yield stack.enter_context(GatewayProcess(_config(urls), env=ENV))


@pytest.fixture(scope="module")
def browser(request: pytest.FixtureRequest) -> Iterator[WebDriver]:
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if shutil.which(p) is None]
    if missing:
        raise RuntimeError(
            f"{', '.join(missing)} not installed: run scripts/ensure-services.sh "
            "(Debian: apt-get install chromium chromium-driver)"
        )
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # CSP violations and JS errors
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(flag)
    # the driver's path is given, so Selenium Manager never looks for (or downloads) one
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    SHOTS.mkdir(parents=True, exist_ok=True)
    try:
        yield driver
    finally:
        driver.quit()
        capture = request.config.pluginmanager.get_plugin("capturemanager")
        with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
            print(f"\nadmin console screenshots: {SHOTS}")


# -- helpers -------------------------------------------------------------------------------------------
def wait(
    driver: WebDriver,
    predicate: Callable[[], Any],
    what: str,
    timeout: float = 20.0,
    shown: Callable[[], str] | None = None,
) -> Any:
    """`predicate`'s first truthy value, polled every 50 ms; on timeout the failure says what `shown`
    reads from the page then. The bound is generous for make test's load (two suites and a real vLLM
    on two cores); a passing wait returns as soon as it holds."""

    def check(_: WebDriver) -> Any:
        try:
            return predicate()
        except StaleElementReferenceException:  # the fleet view re-renders its tables every refresh
            return False

    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.05).until(
            check, f"timed out waiting for {what}"
        )
    except TimeoutException:
        if shown is None:
            raise
        pytest.fail(f"timed out waiting for {what}; the page shows: {shown()!r}")


def css(driver: WebDriver, selector: str) -> WebElement:
    return driver.find_element(By.CSS_SELECTOR, selector)


def click(driver: WebDriver, selector: str) -> None:
    """Click `selector` in a view that re-renders itself: found again if a refresh replaced it
    between finding and clicking (a stale element is not clicked, so a retry clicks once)."""
    wait(driver, lambda: css(driver, selector).click() is None, f"a click on {selector}")


def shoot(driver: WebDriver, name: str) -> None:
    assert driver.save_screenshot(str(SHOTS / f"{name}.png")), f"no screenshot {name}"


def sign_in(driver: WebDriver, base_url: str, token: str = ADMIN_TOKEN) -> None:
    driver.get(base_url + "/admin/ui")
    wait(
        driver,
        lambda: css(driver, "#login").is_displayed() or css(driver, "#tabs").is_displayed(),
        "the page",
    )
    if css(driver, "#tabs").is_displayed():
        css(driver, "#signout").click()
    field = css(driver, "#token")
    field.clear()
    field.send_keys(token)
    css(driver, "#login-form button[type=submit]").click()


def signed_in(driver: WebDriver, base_url: str) -> None:
    """Signed in with the admin token, on the fleet tab."""
    if not driver.current_url.startswith(base_url + "/admin/ui") or not css(driver, "#tabs").is_displayed():
        sign_in(driver, base_url)
        wait(driver, lambda: css(driver, "#tabs").is_displayed(), "the console after sign-in")


def tab(driver: WebDriver, name: str) -> None:
    css(driver, f"#tabs a[data-tab={name}]").click()
    wait(driver, lambda: css(driver, f"#{name}").is_displayed(), f"the {name} tab")


def pools(gw: GatewayProcess) -> dict[str, dict[str, Any]]:
    answer = HTTP.get(gw.base_url + "/admin/pools", headers=ADMIN, timeout=5).json()["pools"]
    return {p["name"]: p for p in answer}


def backend(gw: GatewayProcess, name: str) -> dict[str, Any]:
    return next(b for p in pools(gw).values() for b in p["backends"] if b["name"] == name)


def chat(gw: GatewayProcess, text: str, headers: dict[str, str]) -> httpx.Response:
    body = {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 4}
    return HTTP.post(gw.base_url + "/v1/chat/completions", json=body, headers=headers, timeout=10)


def set_weight(driver: WebDriver, pool: str, weight: str) -> None:
    """Type `weight` (as JavaScript prints the number) into the pool's field, apply, wait for the answer."""
    driver.execute_script("document.getElementById('status').textContent = ''")
    field = css(driver, f"input[data-weight={pool}]")
    field.clear()
    field.send_keys(weight)
    css(driver, f"button[data-apply={pool}]").click()
    done = f"Pool {pool}: weight set to {weight} "
    wait(driver, lambda: css(driver, "#status").text.startswith(done), f"{pool}'s weight {weight}")


def status_text(driver: WebDriver) -> str:
    return css(driver, "#status").text


# -- the shell, over plain HTTP ------------------------------------------------------------------------
def test_the_shell_is_static_with_strict_headers_and_the_api_still_needs_the_token(
    gateway: GatewayProcess,
) -> None:
    with httpx.Client(base_url=gateway.base_url, timeout=5) as http:
        shell = http.get("/admin/ui")
        assert shell.status_code == 200 and shell.headers["content-type"] == "text/html; charset=utf-8"
        assert http.get("/admin/ui/").content == shell.content
        h = shell.headers
        assert h["content-security-policy"] == CSP
        assert "default-src 'self'" in CSP and "frame-ancestors 'none'" in CSP and "unsafe" not in CSP
        assert (h["x-frame-options"], h["x-content-type-options"]) == ("DENY", "nosniff")
        assert h["cache-control"] == "no-cache" and h["referrer-policy"] == "no-referrer"
        again = http.get("/admin/ui", headers={"if-none-match": h["etag"]})
        assert again.status_code == 304 and again.content == b""
        script = http.get("/admin/ui/console.js")
        assert script.headers["content-type"] == "text/javascript; charset=utf-8"
        assert script.headers["content-security-policy"] == CSP
        assert http.get("/admin/ui/console.css").headers["content-type"] == "text/css; charset=utf-8"
        for missing in ("/admin/ui/nope.js", "/admin/ui/console.py", "/admin/ui/%2e%2e%2fconsole.py"):
            assert http.get(missing).status_code == 404, missing
        # the shell holds no data: no pool, backend or address of this fleet
        text = shell.text
        for secret_ish in ("vllm-0", "sglang-1", "127.0.0.1", MODEL):
            assert secret_ish not in text
        # the API behind it is unchanged: no token, no data; its answers are never cached
        assert http.get("/admin/pools").status_code == 401
        answer = http.get("/admin/pools", headers=ADMIN)
        assert answer.status_code == 200 and answer.headers["cache-control"] == "no-store"
        # the console is not on the public API's paths
        assert http.get("/ui").status_code == 404


def test_the_assets_parse_no_data_as_html_load_nothing_external_and_ship_in_the_wheel() -> None:
    files = {p.name: p.read_text(encoding="utf-8") for p in ASSETS.iterdir() if p.is_file()}
    assert set(Console.from_package().assets) == set(files)
    for name, text in files.items():
        for banned in (
            "innerHTML",
            "outerHTML",
            "insertAdjacentHTML",
            "document.write",
            "eval(",
            "Function(",
        ):
            assert banned not in text, f"{name} uses {banned}"
        loads = text.replace('xmlns="http://www.w3.org/2000/svg"', "")  # a namespace name, not a load
        assert not re.search(r"(https?:)?//[a-z0-9.-]+\.[a-z]{2,}/", loads), f"{name} names another origin"
        assert "localStorage" not in text, f"{name}: the token lives in sessionStorage, this tab only"
    index = files["index.html"]
    assert not re.search(r"<script(?![^>]*\bsrc=)", index), "an inline script"
    assert not re.search(r"\s(style|on[a-z]+)=", index), "an inline style or handler"
    # every asset is package data, so a wheel install serves the console
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    patterns = data["gateway.control"]
    for name in files:
        assert any(fnmatch.fnmatch(f"ui/{name}", p) for p in patterns), f"{name} is not package data"


# -- the console in a browser --------------------------------------------------------------------------
def test_a_wrong_token_is_refused_with_a_clear_message(browser: WebDriver, gateway: GatewayProcess) -> None:
    sign_in(browser, gateway.base_url, "not-a-token")
    error = wait(browser, lambda: css(browser, "#login-error").text, "the refusal")
    assert error.startswith("Refused by the gateway (401: "), error
    assert not css(browser, "#tabs").is_displayed()
    assert browser.execute_script("return sessionStorage.length") == 0, "a refused token is not stored"
    shoot(browser, "01-login-refused")
    sign_in(browser, gateway.base_url, USER_TOKEN)  # a valid token without the admin role
    wait(browser, lambda: "403" in css(browser, "#login-error").text, "the 403")
    assert "no admin role" in css(browser, "#login-error").text
    assert not css(browser, "#fleet").is_displayed()


def test_a_weight_set_in_the_console_is_in_the_api_and_moves_traffic(
    browser: WebDriver, gateway: GatewayProcess
) -> None:
    signed_in(browser, gateway.base_url)
    wait(
        browser,
        lambda: len(browser.find_elements(By.CSS_SELECTOR, "tr[data-backend-row]")) == 4,
        "4 backends",
    )
    # what the fleet view shows is what the API says
    api = pools(gateway)
    for name in ("vllm-0", "vllm-1", "sglang-0", "sglang-1"):
        row = css(browser, f"tr[data-backend-row={name}]")
        assert "healthy" in row.text and "closed" in row.text and "serving" in row.text
    for name, pool in api.items():
        assert css(browser, f"[data-weight-now={name}]").text == str(pool["weight"])
    shoot(browser, "02-fleet")

    set_weight(browser, "vllm", "0")
    assert pools(gateway)["vllm"]["weight"] == 0
    served = {chat(gateway, f"after vllm=0, {i}", USER).headers["x-gateway-pool"] for i in range(12)}
    assert served == {"sglang"}
    set_weight(browser, "vllm", "1")
    set_weight(browser, "sglang", "0")
    assert (pools(gateway)["vllm"]["weight"], pools(gateway)["sglang"]["weight"]) == (1, 0)
    served = {chat(gateway, f"after sglang=0, {i}", USER).headers["x-gateway-pool"] for i in range(12)}
    assert served == {"vllm"}
    wait(browser, lambda: css(browser, "[data-weight-now=sglang]").text == "0", "the view to show 0")
    shoot(browser, "03-fleet-weights")
    set_weight(browser, "sglang", "0.5")
    set_weight(browser, "vllm", "0.5")
    # a bad weight is refused in the page with the gateway's message, nothing changes
    set_field = css(browser, "input[data-weight=vllm]")
    set_field.clear()
    set_field.send_keys("2000000")
    css(browser, "button[data-apply=vllm]").click()
    wait(browser, lambda: "Invalid request" in status_text(browser), "the 400")
    assert pools(gateway)["vllm"]["weight"] == 0.5


def test_drain_and_undrain_from_the_console_and_auto_refresh(
    browser: WebDriver, gateway: GatewayProcess
) -> None:
    signed_in(browser, gateway.base_url)
    tab(browser, "fleet")
    click(browser, "button[data-backend=vllm-0]")
    wait(browser, lambda: backend(gateway, "vllm-0")["draining"], "vllm-0 drained in GET /admin/pools")
    wait(
        browser,
        lambda: css(browser, "tr[data-backend-row=vllm-0] [data-state]").text == "draining",
        "the row to show draining",
    )
    wait(browser, lambda: css(browser, "button[data-backend=vllm-0]").text == "Undrain", "Undrain")
    shoot(browser, "04-fleet-drained")
    click(browser, "button[data-backend=vllm-0]")
    wait(browser, lambda: not backend(gateway, "vllm-0")["draining"], "vllm-0 undrained")
    # a change made elsewhere (curl) shows without a click: the view refreshes itself
    HTTP.put(
        gateway.base_url + "/admin/backends/sglang-1/drain", json={"draining": True}, headers=ADMIN, timeout=5
    )
    wait(
        browser,
        lambda: css(browser, "tr[data-backend-row=sglang-1] [data-state]").text == "draining",
        "the auto-refresh",
    )
    HTTP.put(
        gateway.base_url + "/admin/backends/sglang-1/drain",
        json={"draining": False},
        headers=ADMIN,
        timeout=5,
    )


def test_route_explain_shows_pool_backend_and_reason(browser: WebDriver, gateway: GatewayProcess) -> None:
    signed_in(browser, gateway.base_url)
    tab(browser, "explain")
    # The tab puts an example in an empty body once it has read the pools: typing before that could
    # see the body cleared, the example put in and the typed text appended to it - a 400, "not valid
    # JSON" (reproduced by holding GET /admin/pools in the page)
    wait(browser, lambda: css(browser, "#explain-pin option[value=vllm]"), "the pools in the explain tab")
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    body = f'{{"model": "{MODEL}", "messages": [{{"role": "user", "content": "hi"}}], "tools": [{json.dumps(tool)}]}}'
    area = css(browser, "#explain-body")
    area.clear()
    area.send_keys(body)
    css(browser, "#explain-form button[type=submit]").click()
    reason = wait(
        browser,
        lambda: css(browser, "[data-explain=reason]").text,
        "the decision",
        shown=lambda: css(browser, "#explain-result").text,
    )
    assert reason.startswith("rule:tools")
    assert css(browser, "[data-explain=pool]").text == "sglang"
    assert css(browser, "[data-explain=backend]").text in {"sglang-0", "sglang-1"}
    assert css(browser, "[data-explain=routable]").text == "yes"
    shoot(browser, "05-explain")
    Select(css(browser, "#explain-pin")).select_by_value("vllm")
    area.clear()
    area.send_keys(f'{{"model": "{MODEL}", "messages": [{{"role": "user", "content": "hi"}}]}}')
    css(browser, "#explain-form button[type=submit]").click()
    wait(browser, lambda: css(browser, "[data-explain=pool]").text == "vllm", "the pinned decision")
    assert css(browser, "[data-explain=reason]").text.startswith("pin")
    area.clear()
    area.send_keys("{not json")
    css(browser, "#explain-form button[type=submit]").click()
    wait(browser, lambda: "not valid JSON" in css(browser, "#explain-result").text, "the 400")


#: an operator's label that would run script if the page ever parsed data as HTML
LABEL = 'from the console <img src=x onerror="window.pwned=1">'


def test_a_key_created_in_the_console_is_shown_once_works_and_is_revoked_there(
    browser: WebDriver, gateway: GatewayProcess
) -> None:
    signed_in(browser, gateway.base_url)
    tab(browser, "keys")
    for field, value in (
        ("#key-user", "console-user"),
        ("#key-tenant", "acme"),
        ("#key-name", LABEL),
    ):
        css(browser, field).send_keys(value)
    css(browser, "#key-allow").send_keys(MODEL)
    css(browser, "#key-add-budget").click()
    Select(css(browser, "[data-budget=period]")).select_by_value("day")
    css(browser, "[data-budget=usd]").send_keys("5")
    css(browser, "#key-form button[type=submit]").click()
    wait(browser, lambda: css(browser, "#new-key").is_displayed(), "the new key")
    key = css(browser, "#new-key-value").get_attribute("value") or ""
    assert key.startswith("sk-gw-")
    shoot(browser, "06-key-created-secret-once")
    record = next(
        k
        for k in HTTP.get(gateway.base_url + "/admin/api-keys", headers=ADMIN).json()["keys"]
        if k["name"] == LABEL
    )
    assert (record["user"], record["tenant"], record["allow_models"]) == ("console-user", "acme", [MODEL])
    assert record["budgets"] == [{"period": "day", "usd": 5.0}]
    wait(browser, lambda: css(browser, f"tr[data-key={record['id']}]").is_displayed(), "the key's row")
    # data is text, never markup: the label shows as typed and makes no element
    assert LABEL in css(browser, f"tr[data-key={record['id']}]").text
    assert browser.execute_script("return [document.querySelectorAll('main img').length, window.pwned]") == [
        0,
        None,
    ]
    # the page keeps the secret nowhere but that one field
    stored = browser.execute_script(
        "return JSON.stringify(sessionStorage) + JSON.stringify(localStorage) + document.cookie"
    )
    assert key not in stored and key[6:] not in css(browser, "#keys-body").text
    css(browser, "#new-key-done").click()
    assert not css(browser, "#new-key").is_displayed()
    assert (
        key not in (browser.page_source or "") and css(browser, "#new-key-value").get_attribute("value") == ""
    )
    # the key works, as the OpenAI SDK would send it
    answer = chat(gateway, "hello from a console key", {"Authorization": "Bearer " + key})
    assert answer.status_code == 200, answer.text
    # revoke: the first click arms, the second revokes
    button = css(browser, f"button[data-revoke={record['id']}]")
    button.click()
    assert button.text == "Confirm revoke"
    assert chat(gateway, "still valid", {"Authorization": "Bearer " + key}).status_code == 200
    button.click()
    wait(browser, lambda: "Revoked API key" in status_text(browser), "the revocation")
    refused = chat(gateway, "after revoke", {"Authorization": "Bearer " + key})
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
    wait(
        browser,
        lambda: not browser.find_elements(By.CSS_SELECTOR, f"tr[data-key={record['id']}]"),
        "the row gone",
    )


def test_spend_per_tenant_shows_after_a_request(browser: WebDriver, gateway: GatewayProcess) -> None:
    api = HTTP.get(gateway.base_url + "/admin/spend", params={"tenant": "acme"}, headers=ADMIN).json()
    day = next(p for p in api["periods"] if p["period"] == "day")
    assert day["requests"] >= 2 and day["usd"] > 0  # the console key's two requests
    signed_in(browser, gateway.base_url)
    tab(browser, "spend")
    Select(css(browser, "#spend-scope")).select_by_value("tenant")
    css(browser, "#spend-value").send_keys("acme")
    css(browser, "#spend-form button[type=submit]").click()
    cell = wait(browser, lambda: css(browser, "tr[data-period=day] [data-field=requests]").text, "the report")
    assert int(cell) == day["requests"]
    assert css(browser, "tr[data-period=day] [data-field=usd]").text == f"${day['usd']:.6f}"
    assert "Spend of tenant acme" in css(browser, "#spend-result").text
    assert MODEL in css(browser, "#spend-result").text
    shoot(browser, "07-spend")


def test_the_engines_tab_shows_the_comparison(browser: WebDriver, gateway: GatewayProcess) -> None:
    for i in range(3):
        assert chat(gateway, f"compare the engines {i}", USER).status_code == 200
    api = HTTP.get(gateway.base_url + "/admin/engines/compare", headers=ADMIN, timeout=5).json()
    expected = {(r["pool"], r["traffic_class"]): r["requests"] for r in api["rows"]}
    assert sum(expected.values()) >= 3
    signed_in(browser, gateway.base_url)
    tab(browser, "engines")
    rows = wait(
        browser, lambda: browser.find_elements(By.CSS_SELECTOR, "#engines-body tr[data-pool]"), "the rows"
    )
    shown = {
        (r.get_attribute("data-pool"), r.get_attribute("data-class")): int(
            r.find_element(By.CSS_SELECTOR, "[data-field=requests]").text
        )
        for r in rows
    }
    assert shown == expected
    assert "Off (routing.rebalance)" in css(browser, "#engines-loop").text
    assert "this process's requests only" in css(browser, "#engines-body").text  # no Redis here
    shoot(browser, "08-engines")


def test_the_queues_show_the_classes_and_this_replicas_waiting_requests(
    browser: WebDriver, gateway: GatewayProcess
) -> None:
    api = HTTP.get(gateway.base_url + "/admin/flow", headers=ADMIN).json()
    signed_in(browser, gateway.base_url)
    tab(browser, "queues")
    rows = "#queues-body tr[data-class]"
    wait(browser, lambda: browser.find_elements(By.CSS_SELECTOR, rows), "the classes")
    shown = [r.get_attribute("data-class") for r in browser.find_elements(By.CSS_SELECTOR, rows)]
    assert shown == list(api["classes"]) == ["interactive", "standard", "batch"]
    assert (
        css(browser, "#queues-body tr[data-class=batch] .queued").text == "0"
    )  # the fleet is idle: nothing waits
    assert css(browser, "#queues-saturated").text == "none"
    assert "this replica only" in css(browser, "#queues-updated").text
    shoot(browser, "09-queues")


def test_the_audit_log_shows_the_consoles_changes(browser: WebDriver, gateway: GatewayProcess) -> None:
    signed_in(browser, gateway.base_url)
    tab(browser, "audit")
    wait(browser, lambda: browser.find_elements(By.CSS_SELECTOR, "tr[data-action]"), "the entries")
    actions = [
        r.get_attribute("data-action") for r in browser.find_elements(By.CSS_SELECTOR, "tr[data-action]")
    ]
    api = [e["action"] for e in HTTP.get(gateway.base_url + "/admin/audit", headers=ADMIN).json()["entries"]]
    assert actions == api
    assert {"set_weight", "drain", "undrain", "create_api_key", "revoke_api_key"} <= set(actions)
    assert actions[0] == "revoke_api_key"
    first = css(browser, "tr[data-action]").text
    assert "ops" in first
    assert LABEL.replace('"', '\\"') in css(browser, "tr[data-action=create_api_key]").text  # as JSON text
    assert browser.execute_script("return document.querySelectorAll('main img').length") == 0
    shoot(browser, "09-audit")


def test_the_token_lasts_for_the_tab_and_sign_out_forgets_it(
    browser: WebDriver, gateway: GatewayProcess
) -> None:
    signed_in(browser, gateway.base_url)
    browser.refresh()
    wait(browser, lambda: css(browser, "#tabs").is_displayed(), "the console after a reload")
    css(browser, "#signout").click()
    wait(browser, lambda: css(browser, "#login").is_displayed(), "the prompt")
    assert browser.execute_script("return sessionStorage.length") == 0
    assert css(browser, "#login-error").text == "Signed out."


def test_the_page_broke_no_policy_and_threw_nothing(browser: WebDriver) -> None:
    """Runs last: the browser's console over the whole module. The refused sign-ins and the bad
    weight and explain body the tests send are logged as failed loads (401, 403, 400) and are
    expected; a CSP violation, an uncaught error or any other failed load is not."""
    logs = browser.get_log("browser")
    assert logs, "the browser log is not collected"
    bad = [
        e["message"] for e in logs if "Content Security Policy" in e["message"] or "Uncaught" in e["message"]
    ]
    assert bad == []
    unexpected = [
        e["message"]
        for e in logs
        if e["level"] == "SEVERE" and not re.search(r"status of 40[013] ", e["message"])
    ]
    assert unexpected == []
