"""``corral ui`` driven in a real headless Chromium (Debian's ``chromium`` through Playwright).

One world, one ``corral ui`` server and one browser for the whole module. The
world gets real runs (one blocked by the policy, one with a denied network
attempt) and real previews; the tests load every page, follow a run to its
detail, apply one preview with the button and check the workspace on disk,
discard another, watch a new run arrive without a reload, and prove the
refusals: no token, a wrong Host, a bad CSRF token, a non-loopback bind, a
protected path. Screenshots of every page go to ``build/ui-screenshots/``
(or ``$CORRAL_UI_SCREENSHOTS``), which git ignores.

Chromium is kept off the network: background networking, sync, updates and
the like are disabled, and every non-loopback connection goes to a dead proxy.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import World, _processes_mentioning, corral_command
from tests.integration.conftest import needs_bwrap, worlds_root

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
SHOTS = os.environ.get("CORRAL_UI_SCREENSHOTS") or os.path.join(ROOT, "build", "ui-screenshots")
#: flags that keep Chromium off the network and quiet (it runs as root here: --no-sandbox)
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-default-apps",
    "--disable-sync",
    "--disable-extensions",
    "--disable-domain-reliability",
    "--disable-client-side-phishing-detection",
    "--disable-breakpad",
    "--metrics-recording-only",
    "--no-first-run",
    "--no-default-browser-check",
    "--no-pings",
    "--dns-prefetch-disable",
    "--disable-features=Translate,OptimizationHints,MediaRouter,AutofillServerCommunication",
    "--proxy-server=http://127.0.0.1:9",  # anything not on loopback goes nowhere
]

playwright_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright")
expect = playwright_api.expect
pytestmark = [
    needs_bwrap,
    pytest.mark.skipif(not os.access(CHROMIUM, os.X_OK), reason="apt-get install chromium"),
]


#: markup a sandboxed command writes into names, contents and command lines
HOSTILE_NAME = '<img src=x onerror=document.title="pwned">'  # no "/": it is a file name
HOSTILE = HOSTILE_NAME + '<script>document.title="pwned"</script>'


class Site:
    """The world, the running ``corral ui`` and the ids of what was made for the tests."""

    def __init__(self, world: World, process: subprocess.Popen[bytes], url: str) -> None:
        self.world = world
        self.process = process
        self.url = url
        self.origin, _, query = url.partition("/?")
        self.token = query.removeprefix("token=")
        self.previews: dict[str, str] = {}

    def page_url(self, path: str, **params: str) -> str:
        query = "&".join(f"{k}={v}" for k, v in {"token": self.token, **params}.items())
        return f"{self.origin}{path}?{query}"


def _corral(world: World, *args: str) -> subprocess.CompletedProcess[bytes]:
    return world.corral(*args, timeout=120)


def _preview(world: World, script: str) -> str:
    done = _corral(world, "preview", "--", "sh", "-c", script)
    assert done.returncode == 0, done.stderr
    found = re.search(rb"preview (pv-[0-9a-f]{12})", done.stderr)
    assert found, done.stderr
    return found.group(1).decode()


@pytest.fixture(scope="module")
def site() -> Iterator[Site]:
    root = os.path.join(worlds_root(), f"w-{uuid.uuid4().hex[:12]}")
    os.makedirs(root)
    world = World(root)
    process = None
    try:
        world.write(world.ws("app.py"), "def greet():\n    return 'hello'\n")
        world.write(world.ws("notes.txt"), "host version 1\n")
        assert _corral(world, "run", "--", "true").returncode == 0
        assert _corral(world, "run", "--", "sh", "-c", "exit 3").returncode == 3
        # blocked by the policy: a persistence point in the workspace
        _corral(world, "run", "--", "sh", "-c", "echo planted > .bashrc")
        # a denied network attempt (the egress proxy answers on loopback; nothing leaves)
        _corral(
            world,
            "run",
            "--allow-host",
            "pypi.org",
            "--",
            "curl",
            "-s",
            "-m",
            "5",
            "-o",
            "/dev/null",
            "http://denied.example.com/",
        )
        previews = {
            "apply": _preview(
                world,
                "printf \"def greet():\\n    return 'hi there'\\n\" > app.py; echo new > added.txt",
            ),
            "discard": _preview(
                world,
                "echo junk > junk.txt; printf 'a\\000b' > blob.bin; mv README README.md; "
                f"echo '{HOSTILE}' > '{HOSTILE_NAME}.html'",
            ),
            "protected": _preview(world, "echo token=1 > deploy.cfg"),
            "conflict": _preview(world, "echo preview > notes.txt; echo other > other.txt"),
        }
        # the real file changes after the preview began: a conflict
        world.write(world.ws("notes.txt"), "host version 2\n")
        # protected only by settings written after the preview ran: apply refuses it
        # all the same (corral apply honours today's settings too)
        world.write(
            os.path.join(world.home, ".config", "corral", "settings.json"),
            json.dumps({"filesystem": {"protect": ["deploy.cfg"]}}),
        )
        env = dict(world.environ)
        process = subprocess.Popen(
            [*corral_command(), "ui", "--no-open"],
            cwd=world.workspace,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert process.stdout is not None
        line = process.stdout.readline().decode()
        found = re.match(r"corral ui: (http://127\.0\.0\.1:\d+/\?token=[\w-]+)$", line.strip())
        assert found, (line, process.poll())
        s = Site(world, process, found.group(1))
        s.previews = previews
        yield s
    finally:
        if process is not None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            for stream in (process.stdout, process.stderr):
                if stream is not None:
                    stream.close()
        strays = _processes_mentioning(root)
        shutil.rmtree(root, ignore_errors=True)
        assert not strays, f"processes outlived the tests: {strays}"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with playwright_api.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on(  # a refused request (403, 409) is a console error too; the tests check those
        "console",
        lambda msg: (
            errors.append(msg.text)
            if msg.type == "error" and not msg.text.startswith("Failed to load resource")
            else None
        ),
    )
    try:
        yield page
    finally:
        context.close()
    assert not errors, f"the page reported errors: {errors}"


def _shot(page: Any, name: str) -> None:
    os.makedirs(SHOTS, exist_ok=True)
    page.screenshot(path=os.path.join(SHOTS, f"{name}.png"), full_page=True)


def _fetch(url: str, *, data: bytes | None = None, headers: dict[str, str] | None = None) -> int:
    request = urllib.request.Request(url, data=data, headers=headers or {})
    if data is not None:
        request.add_header("Content-Type", "application/x-www-form-urlencoded")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        exc.close()
        return exc.code


def _preview_exists(site: Site, preview_id: str) -> bool:
    return os.path.isdir(os.path.join(site.world.state_dir, "previews", preview_id))


def test_every_page_loads_and_reads_without_javascript(site: Site, browser: Any) -> None:
    context = browser.new_context(
        viewport={"width": 1280, "height": 800}, java_script_enabled=False
    )
    try:
        page = context.new_page()
        page.goto(site.url)
        assert page.locator("h1").inner_text() == "Runs"
        # a fresh server shows the log's tail at once and verifies the chain meanwhile
        for _ in range(50):
            if "verified" in page.locator("#chain").inner_text():
                break
            assert "checking" in page.locator("#chain").inner_text()
            page.wait_for_timeout(100)
            page.reload()
        assert "verified — 8 records, chain intact" in page.locator("#chain").inner_text()
        rows = page.locator("#runs tbody tr")
        assert rows.count() == 4 + 4  # four runs and the four preview runs
        assert "blocked" in page.locator("#runs tbody tr", has_text=".bashrc").inner_text()
        _shot(page, "runs")
        for path, heading, name in (
            ("/previews", "Previews", "previews"),
            ("/sessions", "Sessions", "sessions"),
            ("/overview", "Overview", "overview"),
        ):
            page.goto(site.page_url(path))
            assert page.locator("h1").inner_text() == heading
            _shot(page, name)
        page.goto(site.page_url("/previews"))
        listing = page.locator("main").text_content() or ""
        assert all(p in listing for p in site.previews.values())
        assert "added.txt" in listing and "junk.txt" in listing and "deploy.cfg" in listing
        # the overview's charts are inline SVG with their numbers in tables
        page.goto(site.page_url("/overview"))
        assert page.locator("svg.chart").count() == 4
        assert "denied.example.com" in page.locator("#h-hosts + svg").inner_html()
        # a narrow window: no horizontal scrolling of any page itself (wide tables
        # and diffs scroll inside their own boxes)
        page.set_viewport_size({"width": 420, "height": 800})
        for path in (
            "/runs/4",
            "/previews",
            f"/previews/{site.previews['apply']}",
            "/sessions",
            "/overview",
            "/",
        ):
            page.goto(site.page_url(path))
            overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
            assert overflow <= 1, (path, overflow)
        _shot(page, "runs-narrow")
    finally:
        context.close()


def test_follow_a_run_from_the_table_to_its_detail(site: Site, page: Any) -> None:
    page.goto(site.url)
    page.locator("#runs tbody tr", has_text=".bashrc").get_by_role("link").first.click()
    assert page.locator("h1").inner_text().startswith("Run #")
    violations = page.locator("#violations + .scroll table").inner_text()
    assert "filesystem.protect: **/.bashrc" in violations and "fs-write" in violations
    # the effective policy with each value's source, as `corral policy --explain`
    policy = page.locator("pre.policy").inner_text()
    assert "(defaults" in policy and "policy digest: sha256:" in policy
    _shot(page, "run-detail")
    page.go_back()
    page.locator("#runs tbody tr", has_text="denied.example.com").get_by_role("link").first.click()
    network = page.locator("#network + .scroll table").inner_text()
    assert "denied.example.com" in network and "deny" in network and "80" in network


def test_the_table_filters(site: Site, page: Any) -> None:
    page.goto(site.url)
    page.get_by_label("Outcome").select_option("blocked")
    page.get_by_role("button", name="Filter").click()
    rows = page.locator("#runs tbody tr")
    assert rows.count() == 2 and all("blocked" in t for t in rows.all_inner_texts())
    table = page.locator("#runs").inner_text()
    assert ".bashrc" in table and "denied.example.com" in table
    page.get_by_label("Command").fill("DENIED.example")
    page.get_by_role("button", name="Filter").click()
    assert page.locator("#runs tbody tr").count() == 1
    page.get_by_role("link", name="Clear").click()
    assert page.locator("#runs tbody tr").count() >= 8


def test_keyboard_reaches_the_skip_link_and_the_pages(site: Site, page: Any) -> None:
    page.goto(site.url)
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent") == "Skip to content"
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent") == "Runs"
    page.keyboard.press("Tab")
    page.keyboard.press("Enter")
    page.wait_for_url("**/previews?**")
    assert page.locator("h1").inner_text() == "Previews"


def test_a_new_run_appears_live_without_reload(site: Site, page: Any) -> None:
    page.goto(site.url)
    expect(page.locator("#live")).to_contain_text("Live:", timeout=15000)
    page.evaluate("window.__notReloaded = true")
    before = int(page.locator("#total").inner_text())
    # a command line with a line break (it must not cut the event short)
    done = _corral(site.world, "run", "--", "sh", "-c", "echo live-marker-4711\r\necho end-4711")
    assert done.returncode == 0, done.stderr
    row = page.locator("#runs tbody tr", has_text="live-marker-4711")
    row.wait_for(timeout=15000)
    assert "end-4711" in row.inner_text() and row.locator("td").count() == 10
    assert page.evaluate("window.__notReloaded") is True
    assert page.locator("#runs tbody tr").first.inner_text() == row.inner_text()
    assert int(page.locator("#total").inner_text()) == before + 1
    assert "verified" in page.locator("#chain").inner_text()


def test_apply_a_preview_with_the_button(site: Site, page: Any) -> None:
    preview_id = site.previews["apply"]
    page.goto(site.page_url(f"/previews/{preview_id}"))
    diff = page.locator("section.file", has_text="app.py").locator("pre.diff")
    assert "hi there" in diff.inner_text()
    assert diff.locator(".gi").count() >= 1 and diff.locator(".gd").count() >= 1
    assert diff.locator(".gi .k, .gd .k, .gi .s1, .gd .s1").count() >= 1  # Python tokens coloured
    _shot(page, "preview")
    assert site.world.read(site.world.ws("app.py")) == "def greet():\n    return 'hello'\n"
    page.locator("#apply").click()
    assert "Applied 2 path(s)" in page.locator("#result").inner_text()
    assert site.world.read(site.world.ws("app.py")) == "def greet():\n    return 'hi there'\n"
    assert site.world.read(site.world.ws("added.txt")) == "new\n"
    assert not _preview_exists(site, preview_id)


def test_discard_a_preview_with_the_button(site: Site, page: Any) -> None:
    preview_id = site.previews["discard"]
    page.goto(site.page_url(f"/previews/{preview_id}"))
    renamed = page.locator("section.file", has_text="README.md").inner_text()
    assert "renamed" in renamed and "README → README.md" in renamed
    binary = page.locator("section.file", has_text="blob.bin").inner_text()
    assert "binary file, new: 3 bytes, sha256 " in binary
    assert page.locator("section.file", has_text="blob.bin").locator("pre").count() == 0
    # what the sandboxed command wrote is shown as text, never as markup
    hostile = page.locator("section.file", has_text="onerror")
    assert HOSTILE_NAME in hostile.locator("h3").inner_text()
    assert HOSTILE in hostile.locator("pre").inner_text()
    assert page.locator("main img, main script").count() == 0
    assert page.title() != "pwned"
    page.goto(site.url)
    page.locator("#runs tbody tr", has_text="junk.txt").get_by_role("link").first.click()
    assert HOSTILE in page.locator("pre.command").inner_text()  # the run's full command line
    assert page.locator("main img, main script").count() == 0 and page.title() != "pwned"
    page.goto(site.page_url(f"/previews/{preview_id}"))
    _shot(page, "preview-renamed-binary")
    page.locator("#discard").click()
    assert "Discarded preview" in page.locator("#result").inner_text()
    assert not _preview_exists(site, preview_id)
    assert not os.path.exists(site.world.ws("junk.txt"))
    assert not os.path.exists(site.world.ws("blob.bin"))
    assert site.world.read(site.world.ws("README")) == "hello\n"


def test_a_protected_path_is_refused_as_corral_apply_refuses_it(site: Site, page: Any) -> None:
    preview_id = site.previews["protected"]
    page.goto(site.page_url(f"/previews/{preview_id}"))
    assert "deploy.cfg" in page.locator("fieldset").first.inner_text()
    page.locator("#apply").click()
    error = page.locator("#error").inner_text()
    assert "protected paths" in error and "deploy.cfg" in error
    assert not os.path.exists(site.world.ws("deploy.cfg"))
    assert _preview_exists(site, preview_id)
    # the CLI says the same
    done = _corral(site.world, "apply", preview_id)
    assert done.returncode == 125 and b"deploy.cfg" in done.stderr
    assert not os.path.exists(site.world.ws("deploy.cfg"))


def test_conflicts_since_the_preview_began_are_shown_and_refused(site: Site, page: Any) -> None:
    preview_id = site.previews["conflict"]
    page.goto(site.page_url(f"/previews/{preview_id}"))
    conflicts = page.locator("section.warn", has_text="Conflicts").inner_text()
    assert "notes.txt" in conflicts
    page.locator("#apply").click()  # "refuse" is the default, as in `corral apply`
    error = page.locator("#error").inner_text()
    assert "changed in the real workspace" in error and "notes.txt" in error
    assert site.world.read(site.world.ws("notes.txt")) == "host version 2\n"
    assert not os.path.exists(site.world.ws("other.txt"))
    page.go_back()
    page.get_by_label("leave them out").check()  # --skip-conflicts
    page.locator("#apply").click()
    assert "Applied 1 path(s)" in page.locator("#result").inner_text()
    assert site.world.read(site.world.ws("other.txt")) == "other\n"
    assert site.world.read(site.world.ws("notes.txt")) == "host version 2\n"
    assert _preview_exists(site, preview_id)  # kept: what was left out is still in it


def test_requests_without_the_token_or_with_a_bad_csrf_token_are_refused(
    site: Site, page: Any
) -> None:
    preview_id = site.previews["protected"]
    # no token, a wrong token: refused, static files included
    assert _fetch(f"{site.origin}/") == 403
    assert _fetch(f"{site.origin}/static/ui.css") == 403
    assert _fetch(site.page_url("/", token="x" * 43).replace(f"token={site.token}&", "")) == 403
    assert _fetch(site.page_url("/")) == 200
    # a DNS-rebinding page reaches the port under its own name: refused
    assert (
        _fetch(
            site.page_url("/"), headers={"Host": f"evil.example:{site.origin.rsplit(':', 1)[1]}"}
        )
        == 403
    )
    # state changes only by POST
    assert _fetch(site.page_url(f"/previews/{preview_id}/discard")) == 405
    # a POST with a bad or missing CSRF token, or from another origin: refused, nothing done
    url = site.page_url(f"/previews/{preview_id}/discard")
    assert _fetch(url, data=b"csrf=wrong") == 403
    assert _fetch(url, data=b"") == 403
    page.goto(site.page_url(f"/previews/{preview_id}"))
    csrf = page.locator("input[name=csrf]").first.get_attribute("value")
    assert (
        _fetch(url, data=f"csrf={csrf}".encode(), headers={"Origin": "http://evil.example"}) == 403
    )
    assert _preview_exists(site, preview_id)
    # in the browser: a form whose token was tampered with
    page.evaluate(
        "document.querySelectorAll('input[name=csrf]').forEach(i => i.value = 'tampered')"
    )
    response_status: list[int] = []
    page.on("response", lambda r: response_status.append(r.status))
    page.locator("#discard").click()
    page.wait_for_load_state()
    assert 403 in response_status
    assert "CSRF" in page.content()
    assert _preview_exists(site, preview_id)


SESSION_OWNER = """
import sys
from corral import Sandbox
sbx = Sandbox(workspace=sys.argv[1])
running = sbx.spawn(["sh", "-c", "echo x > /tmp/left-behind; while :; do sleep 1; done"])
print(sbx.id, flush=True)
sys.stdin.readline()
outcome = running.wait(timeout=10)
print(outcome.returncode, outcome.signal, flush=True)
try:
    sbx.close()
except Exception as exc:
    print("close:", type(exc).__name__, flush=True)
"""


def _in_session(tmp_dir: str) -> list[int]:
    """Host processes that have *tmp_dir* mounted (a session's sandboxed processes)."""
    found = []
    name = "/" + os.path.basename(tmp_dir) + " "
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/mountinfo", encoding="utf-8", errors="replace") as f:
                if name in f.read():
                    found.append(int(pid))
        except OSError:
            pass
    return found


def test_sessions_lists_a_live_sdk_session_and_destroys_it(site: Site, page: Any) -> None:
    import sys
    import time

    owner = subprocess.Popen(
        [sys.executable, "-c", SESSION_OWNER, site.world.workspace],
        env=site.world.environ,
        cwd=site.world.workspace,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert owner.stdout is not None and owner.stdin is not None
        sandbox_id = owner.stdout.readline().decode().strip()
        assert sandbox_id.startswith("sbx-"), owner.stderr.read() if owner.stderr else ""
        tmp_dir = os.path.join(site.world.state_dir, "sessions", f"{owner.pid}-{sandbox_id}")
        deadline = time.monotonic() + 15
        while not os.path.exists(os.path.join(tmp_dir, "left-behind")):
            assert time.monotonic() < deadline, "the session's command did not start"
            time.sleep(0.1)
        assert _in_session(tmp_dir)
        page.goto(site.page_url("/sessions"))
        row = page.locator("#sessions tbody tr", has_text=sandbox_id)
        cells = row.locator("td")
        assert cells.nth(1).inner_text() == "SDK" and str(owner.pid) in cells.nth(2).inner_text()
        assert int(cells.nth(4).inner_text()) >= 2  # the shell and its sleep, at least
        _shot(page, "sessions")
        row.get_by_role("button", name="Destroy").click()
        assert f"Destroyed session {sandbox_id}" in page.locator("#result").inner_text()
        # its command is gone (killed), its /tmp removed, the owner untouched
        deadline = time.monotonic() + 10
        while _in_session(tmp_dir):
            assert time.monotonic() < deadline, _in_session(tmp_dir)
            time.sleep(0.1)
        assert not os.path.exists(tmp_dir)
        assert owner.poll() is None
        owner.stdin.write(b"\n")
        owner.stdin.flush()
        assert owner.stdout.readline().split()[-1] == b"9"  # the command died of SIGKILL
        page.goto(site.page_url("/sessions"))
        assert sandbox_id not in page.locator("main").inner_text()
    finally:
        if owner.stdin is not None:
            owner.stdin.close()
        try:
            owner.wait(timeout=15)
        except subprocess.TimeoutExpired:
            owner.kill()
            owner.wait()
        for stream in (owner.stdout, owner.stderr):
            if stream is not None:
                stream.close()


def test_sessions_shows_the_sandboxes_of_a_corral_mcp_server(site: Site) -> None:
    pytest.importorskip("mcp", reason="pip install 'corral[mcp]'")
    import asyncio

    from mcp import Client, StdioServerParameters

    params = StdioServerParameters(
        command=corral_command()[0],
        args=[*corral_command()[1:], "mcp"],
        env=site.world.environ,
        cwd=site.world.workspace,
    )

    def sessions_page() -> str:
        with urllib.request.urlopen(site.page_url("/sessions"), timeout=10) as response:
            return str(response.read().decode())

    async def main() -> tuple[str, str]:
        async with Client(params, mode="legacy") as client:
            created = await client.call_tool("sandbox_create", {})
            assert not created.is_error, created.content
            sandbox_id = str(created.structured_content["sandbox_id"])
            return sandbox_id, await asyncio.to_thread(sessions_page)

    # in a thread of its own: Playwright's sync API runs an event loop in this one
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        sandbox_id, html = pool.submit(asyncio.run, asyncio.wait_for(main(), 120)).result()
    row = next(line for line in html.splitlines() if sandbox_id in line and "<tr>" in line)
    assert "<td>MCP</td>" in row and " mcp" in row
    assert sandbox_id not in sessions_page()  # the server closed it when the client left


def test_a_non_loopback_bind_is_refused(site: Site) -> None:
    for host in ("0.0.0.0", "192.0.2.1", "example.com"):
        done = site.world.corral("ui", "--no-open", "--host", host, timeout=30)
        assert done.returncode == 125, (host, done.stderr)
        assert b"loopback" in done.stderr or b"not an IP address" in done.stderr


def test_an_edited_audit_record_shows_the_chain_broken_live(site: Site, page: Any) -> None:
    # last in the module: it tampers with the log
    page.goto(site.url)
    expect(page.locator("#chain")).to_contain_text("verified", timeout=15000)
    path = os.path.join(site.world.state_dir, "audit.jsonl")
    with open(path, "rb") as f:
        rows = f.read().splitlines()
    record = json.loads(rows[1])
    record["exit_status"] = 0  # run #2 exited 3: make it look clean
    rows[1] = json.dumps(record).encode()
    with open(path, "wb") as f:
        f.write(b"".join(r + b"\n" for r in rows))
    expect(page.locator("#chain")).to_contain_text("BROKEN", timeout=15000)  # no reload
    assert "line 3" in page.locator("#chain").inner_text()
    page.reload()
    assert "BROKEN" in page.locator("#chain").inner_text()
