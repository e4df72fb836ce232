"""The routes of ``corral ui``: server-rendered pages, one event stream, three POST actions.

Every page reads without JavaScript; ``static/ui.js`` only subscribes the
Runs page to ``/events`` (server-sent events) and inserts the rows the server
rendered. Access rules (token, Host, CSRF, methods, headers) are enforced in
front of all of this by :class:`corral.ui._guard.Guard`.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

import anyio
from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.responses import HTMLResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from ._guard import Guard, Secrets
from ._runs import Chain, Filters, Run, RunIndex

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from starlette.requests import Request
    from starlette.types import ASGIApp

__all__ = ["PAGE_SIZE", "UI", "build", "build_app"]

#: rows per page of the runs table
PAGE_SIZE = 50
#: how often the event stream looks for new records (``corral audit --follow`` polls as often)
POLL_SECONDS = 0.25
_HERE = os.path.dirname(os.path.abspath(__file__))


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


class UI:
    """The state one ``corral ui`` serves: the state dir, its run index, the secrets."""

    def __init__(self, state_dir: str, secrets: Secrets) -> None:
        self.state_dir = state_dir
        self.secrets = secrets
        self.index = RunIndex(state_dir)
        self.env = Environment(
            loader=FileSystemLoader(os.path.join(_HERE, "templates")),
            autoescape=select_autoescape(default=True),
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self.env.globals.update(u=self.url, csrf=secrets.csrf, token=secrets.token, size=_size)
        self.env.filters["when"] = lambda t: time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))
        for name in self.env.list_templates(extensions=["html"]):
            self.env.get_template(name)  # compiled at start, not on a first request

    def url(self, path: str, **params: Any) -> str:
        """*path* with the token and *params* (empty ones left out) as its query."""
        query = {
            "token": self.secrets.token,
            **{k: v for k, v in params.items() if v not in ("", None)},
        }
        return f"{path}?{urlencode(query)}"

    def render(self, name: str, status: int = 200, **context: Any) -> HTMLResponse:
        """Render template *name*."""
        return HTMLResponse(self.env.get_template(name).render(**context), status_code=status)

    def row(self, run: Run) -> str:
        """One runs-table row as HTML (the page and the event stream share it)."""
        return self.env.get_template("_row.html").render(run=run)

    # ------------------------------------------------------------ runs
    async def runs_page(self, request: Request) -> Response:
        """``GET /``: the runs table (filters, pages of 50), the timeline, the chain's state."""
        q = request.query_params
        filters = _filters(request)
        try:
            page = max(int(q.get("page", "1")), 1)
        except ValueError:
            page = 1
        from ._charts import timeline

        if not self.index.indexed and not filters and page == 1:
            # a fresh server: the first screen comes from the log's tail while the
            # whole log is read and its chain verified in the background; the
            # event stream then reports the chain's state
            recent, total = await anyio.to_thread.run_sync(self.index.tail, 200)
            self.index.build_in_background()
            runs = recent[:PAGE_SIZE]
            chain = Chain(None, f"verifying the chain of {total} records...")
            backends = sorted({r.backend for r in recent})
            last_seq = recent[0].seq if recent else 0
        else:
            await anyio.to_thread.run_sync(self.index.refresh)
            runs, total = self.index.page(filters, start=(page - 1) * PAGE_SIZE, limit=PAGE_SIZE)
            chain = await anyio.to_thread.run_sync(self.index.chain)
            recent, _ = self.index.page(Filters(), start=0, limit=200)
            backends = self.index.backends()
            last_seq = self.index.last_seq()
        return self.render(
            "runs.html",
            nav="runs",
            runs=runs,
            total=total,
            page=page,
            pages=max((total + PAGE_SIZE - 1) // PAGE_SIZE, 1),
            filters=filters,
            backends=backends,
            chain=chain,
            timeline=timeline(recent[::-1]),
            events=self.url(
                "/events",
                after=last_seq,
                q=filters.text,
                backend=filters.backend,
                status=filters.status,
                session=filters.session,
            )
            if page == 1
            else None,
        )

    async def run_page(self, request: Request) -> Response:
        """``GET /runs/N``: one record in full, and the effective policy with its sources."""
        seq = int(request.path_params["seq"])
        await anyio.to_thread.run_sync(self.index.refresh)
        record = await anyio.to_thread.run_sync(self.index.record, seq)
        if record is None:
            return self.render(
                "error.html", 404, message=f"There is no run #{seq} in the audit log."
            )
        policy = await anyio.to_thread.run_sync(_explain_for, record)
        return self.render("run.html", nav="runs", r=record, policy=policy)

    async def events(self, request: Request) -> Response:
        """``GET /events``: server-sent ``run`` events (rendered rows) and ``chain`` events."""
        q = request.query_params
        try:
            after = int(q.get("after", "0"))
        except ValueError:
            after = 0
        filters = _filters(request)

        async def stream() -> AsyncIterator[str]:
            nonlocal after
            chain_text = ""
            idle = 0.0
            yield "retry: 2000\n\n"
            while not await request.is_disconnected():
                await anyio.to_thread.run_sync(self.index.refresh)
                for run in self.index.after(after, filters):
                    # one data line: a CR or LF inside the row (a command line may hold
                    # them) would end it early; as character references they render alike
                    row = self.row(run).strip().replace("\r", "&#13;").replace("\n", "&#10;")
                    yield f"event: run\nid: {run.seq}\ndata: {row}\n\n"
                    after = run.seq
                    idle = 0.0
                after = max(after, self.index.last_seq())
                chain = await anyio.to_thread.run_sync(self.index.chain)
                text = ("ok " if chain.ok else "broken ") + chain.message
                if text != chain_text:
                    chain_text = text
                    yield f"event: chain\ndata: {text}\n\n"
                idle += POLL_SECONDS
                if idle >= 15:
                    idle = 0.0
                    yield ": keep-alive\n\n"
                await anyio.sleep(POLL_SECONDS)

        return StreamingResponse(
            stream(), media_type="text/event-stream", headers={"x-accel-buffering": "no"}
        )

    # ------------------------------------------------------------ previews
    async def previews_page(self, request: Request) -> Response:
        """``GET /previews``: every pending preview with its changed paths."""
        from ..preview import Preview
        from ._previews import view

        def load() -> list[Any]:
            return [view(p, with_diffs=False) for p in Preview.list(state_dir=self.state_dir)]

        return self.render(
            "previews.html", nav="previews", previews=await anyio.to_thread.run_sync(load)
        )

    def _open(self, preview_id: str) -> Any:
        from ..preview import Preview

        return Preview.open(preview_id, state_dir=self.state_dir)

    async def preview_page(self, request: Request) -> Response:
        """``GET /previews/ID``: the full review of one preview, with Apply and Discard."""
        from .._exceptions import CorralError
        from ._previews import view

        try:
            shown = await anyio.to_thread.run_sync(
                lambda: view(self._open(request.path_params["id"]))
            )
        except CorralError as exc:
            return self.render("error.html", 404, message=exc.message, hint=exc.hint)
        return self.render("preview.html", nav="previews", p=shown)

    async def apply(self, request: Request) -> Response:
        """``POST /previews/ID/apply``: what ``corral apply`` does, with the form's options."""
        from .._exceptions import CorralError
        from ..cli.commands.apply import apply_with_settings

        form: dict[str, list[str]] = request.scope["corral.form"]
        mode = form.get("conflicts", ["refuse"])[0]
        preview_id = request.path_params["id"]

        def work() -> Any:
            return apply_with_settings(
                self._open(preview_id),
                allow_protected=tuple(form.get("allow_protected", [])),
                force=mode == "force",
                skip_conflicts=mode == "skip",
                keep="keep" in form,
            )

        try:
            result = await anyio.to_thread.run_sync(work)
        except CorralError as exc:  # protected paths, conflicts (ApplyConflict), busy, gone
            return self.render(
                "error.html", 409, message=exc.message, hint=exc.hint, back=preview_id
            )
        return self.render(
            "applied.html", 200 if not result.failed else 500, nav="previews", result=result
        )

    async def discard(self, request: Request) -> Response:
        """``POST /previews/ID/discard``: what ``corral discard ID`` does."""
        from .._exceptions import CorralError

        preview_id = request.path_params["id"]
        try:
            preview = await anyio.to_thread.run_sync(self._open, preview_id)
            await anyio.to_thread.run_sync(preview.discard)
        except CorralError as exc:
            return self.render(
                "error.html", 409, message=exc.message, hint=exc.hint, back=preview_id
            )
        return self.render(
            "done.html",
            nav="previews",
            message=f"Discarded preview {preview.id} of {preview.workspace}; the workspace was not touched.",
        )

    # ------------------------------------------------------------ sessions
    async def sessions_page(self, request: Request) -> Response:
        """``GET /sessions``: the live SDK and MCP sessions."""
        from ._sessions import sessions

        found = await anyio.to_thread.run_sync(sessions, self.state_dir)
        return self.render("sessions.html", nav="sessions", sessions=found)

    async def destroy(self, request: Request) -> Response:
        """``POST /sessions/ID/destroy``: kill the session's sandboxed processes, remove its /tmp."""
        from ._sessions import destroy

        sandbox_id = request.path_params["id"]
        try:
            killed = await anyio.to_thread.run_sync(destroy, self.state_dir, sandbox_id)
        except LookupError as exc:
            return self.render("error.html", 404, message=str(exc))
        return self.render(
            "done.html",
            nav="sessions",
            message=f"Destroyed session {sandbox_id}: {killed} process(es) killed, its /tmp removed.",
        )

    async def pygments_css(self, request: Request) -> Response:
        """The token colours of the installed Pygments (no build step, always in step)."""
        from pygments.formatters import HtmlFormatter

        css = HtmlFormatter(style="default").get_style_defs(".highlight")
        return Response(css, media_type="text/css")

    # ------------------------------------------------------------ overview
    async def overview_page(self, request: Request) -> Response:
        """``GET /overview``: the charts."""
        from ._charts import DURATION_BUCKETS, bar_chart, columns, duration_chart, overview

        await anyio.to_thread.run_sync(self.index.refresh)
        data = overview(self.index.runs())
        return self.render(
            "overview.html",
            nav="overview",
            data=data,
            buckets=[label for _, label in DURATION_BUCKETS],
            backend_chart=bar_chart("Runs per backend", data.per_backend),
            duration_chart=duration_chart(data),
            blocked_chart=columns("Blocked attempts over time", data.blocked),
            hosts_chart=bar_chart("Top denied hosts", data.top_hosts, css="denied"),
            chain=await anyio.to_thread.run_sync(self.index.chain),
        )


def _filters(request: Request) -> Filters:
    """The runs table's filters from the query (bounded; an unknown outcome is ignored)."""
    q = request.query_params
    status = q.get("status", "")
    return Filters(
        text=q.get("q", "")[:200],
        backend=q.get("backend", "")[:64],
        status=status if status in ("ok", "failed", "blocked") else "",
        session=q.get("session", "")[:128],
    )


def _explain_for(record: dict[str, Any]) -> dict[str, Any]:
    """The effective policy for the run's directory and command today, as ``policy --explain``."""
    from .._exceptions import CorralError
    from ..policy import explain, load_settings, policy_digest

    cwd = str(record.get("cwd") or "")
    argv = record.get("argv") or []
    if not os.path.isdir(cwd):
        return {"text": None, "note": f"The run's directory {cwd} no longer exists."}
    try:
        resolved = load_settings(cwd=cwd, command=[str(a) for a in argv])
    except CorralError as exc:
        return {"text": None, "note": f"The settings for {cwd} no longer load: {exc.message}"}
    digest = policy_digest(resolved.policy)
    recorded = str(record.get("policy_digest") or "").removeprefix("sha256:")
    same = recorded == digest
    note = (
        "This is the policy the run had: its digest matches the audit record."
        if same
        else f"The settings changed since this run (digest now {digest[:16]}..., "
        f"the run had {recorded[:16] or 'none'}...): this is today's policy for the run's "
        "directory and command, not necessarily the run's (flags and environment are not recorded)."
    )
    return {"text": explain(resolved), "note": note, "same": same}


def build_app(state_dir: str, secrets: Secrets) -> ASGIApp:
    """The guarded ASGI application for *state_dir*."""
    return build(state_dir, secrets)[0]


def build(state_dir: str, secrets: Secrets) -> tuple[ASGIApp, UI]:
    """The guarded ASGI application for *state_dir*, and the :class:`UI` behind it."""
    ui = UI(state_dir, secrets)
    app = Starlette(
        routes=[
            Route("/", ui.runs_page),
            Route("/runs/{seq:int}", ui.run_page),
            Route("/events", ui.events),
            Route("/previews", ui.previews_page),
            Route("/previews/{id}", ui.preview_page),
            Route("/previews/{id}/apply", ui.apply, methods=["POST"]),
            Route("/previews/{id}/discard", ui.discard, methods=["POST"]),
            Route("/sessions", ui.sessions_page),
            Route("/sessions/{id}/destroy", ui.destroy, methods=["POST"]),
            Route("/overview", ui.overview_page),
            Route("/style/pygments.css", ui.pygments_css),
            Mount("/static", StaticFiles(directory=os.path.join(_HERE, "static")), name="static"),
        ]
    )
    return Guard(app, secrets), ui
