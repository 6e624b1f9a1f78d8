"""The console's web application: Starlette routes over console/data.py, Jinja2 templates,
htmx and uPlot served from the package's own static files (nothing from a CDN).

Safety, in the order every write (POST) is checked: read-only mode refuses it (403, even a
request forged without the page), then the session (login when a users file is given), the
role (admin), and the CSRF token (form field `csrf` or header X-CSRF-Token). Pages carry no
secret: the access key the console signs with never reaches a template or a log line.
"""
from __future__ import annotations

import asyncio
import contextlib
import csv
import io
import json
import logging
import os
import secrets
import time
from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import (JSONResponse, PlainTextResponse, RedirectResponse, Response,
                                 StreamingResponse)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from pocketmq.client.errors import BrokerError, MessageNotFoundError
from pocketmq.common.constants import DLQ_GROUP_TOPIC_PREFIX
from pocketmq.console import auth, logic
from pocketmq.console.data import Cluster, GroupSnapshot, MAX_LIST
from pocketmq.console.streams import Busy, Searches, Tails, parse_positions
from pocketmq.protocol.names import TOPIC, name_error
from pocketmq.tools.mqadmin.errors import AdminError

log = logging.getLogger("pocketmq.console")
HERE = Path(__file__).parent
COOKIE = "pocketmq_console"
SAMPLE_INTERVAL_S = 10.0
CSP = ("default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
       "connect-src 'self'; frame-ancestors 'none'; form-action 'self'")


class Refused(Exception):
    def __init__(self, status: int, text: str):
        super().__init__(text)
        self.status = status


class Sampler:
    """Every `interval_s`: each group's lag, clients and TPS (the groups page's rows) and a point
    of its lag history (logic.LagHistory), fetched concurrently."""

    def __init__(self, cluster: Cluster, interval_s: float, history: logic.LagHistory):
        self.cluster = cluster
        self.interval_s = interval_s
        self.history = history
        self.latest: dict[str, GroupSnapshot] = {}
        self.rounds = 0
        self.ready = asyncio.Event()
        self.wake = asyncio.Event()

    async def sample_once(self) -> None:
        self.cluster.cache.clear()
        names = await self.cluster.group_names()
        masters = await self.cluster.masters()
        snaps = await asyncio.gather(*(self.cluster.group_snapshot(g, masters) for g in names),
                                     return_exceptions=True)
        now = self.cluster.clock()
        latest = {}
        for g, s in zip(names, snaps):
            if isinstance(s, BaseException):
                s = GroupSnapshot(g, None, 0, "", "", 0.0, str(s))
            latest[g] = s
            self.history.add(g, now, s.lag)
        self.latest = latest
        self.rounds += 1
        self.ready.set()

    async def run(self) -> None:
        while True:
            try:
                await self.sample_once()
            except asyncio.CancelledError:
                raise
            except Exception as e:      # an unreachable nameserver: the next round retries
                log.warning("console: lag sampling failed: %s", e)
                self.ready.set()
            self.wake.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.wake.wait(), self.interval_s)


class Console:
    def __init__(self, cluster: Cluster, *, read_only: bool = False, users: dict | None = None,
                 sample_interval_s: float = SAMPLE_INTERVAL_S, secret: bytes | None = None):
        self.cluster = cluster
        self.read_only = read_only
        self.users = users
        self.secret = secret or secrets.token_bytes(32)
        self.history = logic.LagHistory()
        self.sampler = Sampler(cluster, sample_interval_s, self.history)
        self.tails = Tails(cluster)
        self.searches = Searches(cluster)
        self.templates = Jinja2Templates(directory=str(HERE / "templates"))
        self.templates.env.globals.update(format_ms=logic.format_ms, lag_text=logic.lag_text)
        self._sampler_task: asyncio.Task | None = None

    # -- sessions ----------------------------------------------------------------------------
    def session_of(self, request: Request) -> tuple[auth.Session, bool]:
        """(the request's session, whether a new cookie must be set). Without a users file
        everybody is an anonymous admin (viewer when read-only); with one, a visitor who has
        not logged in has an anonymous session (name "") that only carries the CSRF nonce."""
        now = int(time.time())
        s = auth.read_session_cookie(self.secret, request.cookies.get(COOKIE), now)
        if s is not None:
            return s, False
        role = "viewer" if self.users is not None or self.read_only else "admin"
        return auth.Session("", role, now + auth.SESSION_TTL_S, secrets.token_hex(16)), True

    def logged_in(self, s: auth.Session) -> bool:
        return self.users is None or (s.name in self.users and s.name != "")

    def can_write(self, s: auth.Session) -> bool:
        return not self.read_only and self.logged_in(s) and s.role == "admin"

    def set_cookie(self, resp: Response, s: auth.Session) -> None:
        resp.set_cookie(COOKIE, auth.make_session_cookie(self.secret, s), max_age=auth.SESSION_TTL_S,
                        httponly=True, samesite="strict", path="/")

    def render(self, request: Request, name: str, status: int = 200, **ctx) -> Response:
        s = request.state.session
        ctx.update(request=request, read_only=self.read_only, can_write=self.can_write(s),
                   user=s.name if self.users is not None else None, login=self.users is not None,
                   csrf=auth.csrf_token(self.secret, s.nonce), namesrv=";".join(self.cluster.session.namesrv_addrs))
        return self.templates.TemplateResponse(request, name, ctx, status_code=status)

    def check_csrf(self, request: Request, form: dict) -> None:
        s = request.state.session
        if not auth.csrf_ok(self.secret, s.nonce, request.headers.get("x-csrf-token") or form.get("csrf")):
            raise Refused(403, "missing or wrong CSRF token: reload the page and retry")

    async def check_write(self, request: Request) -> dict:
        """The form of an allowed write; Refused otherwise (see the module's docstring)."""
        if self.read_only:
            log.warning("console: write refused in read-only mode: %s %s", request.method, request.url.path)
            raise Refused(403, "this console is read-only: writes are refused")
        s = request.state.session
        if not self.logged_in(s):
            raise Refused(401, "log in first")
        if s.role != "admin":
            raise Refused(403, f"user {s.name} is a viewer: writes need the admin role")
        form = dict(await request.form())
        self.check_csrf(request, form)
        return form

    # -- the application ---------------------------------------------------------------------
    def build(self) -> Starlette:
        c = self

        def page(handler, write: bool = False, login_page: bool = False):
            async def endpoint(request: Request):
                s, new = c.session_of(request)
                request.state.session = s
                try:
                    if not login_page and not c.logged_in(s):
                        if request.method == "GET" and "text/event-stream" not in request.headers.get("accept", ""):
                            resp = RedirectResponse(f"/login?next={request.url.path}", status_code=303)
                        else:
                            raise Refused(401, "log in first")
                    else:
                        form = await c.check_write(request) if write else None
                        resp = await (handler(request, form) if write else handler(request))
                except Refused as e:
                    resp = c.render(request, "error.html", status=e.status, error=str(e))
                except AdminError as e:
                    status = 404 if "does not exist" in str(e) else 502
                    resp = c.render(request, "error.html", status=status, error=str(e))
                except MessageNotFoundError as e:
                    resp = c.render(request, "error.html", status=404, error=str(e))
                except ValueError as e:
                    resp = c.render(request, "error.html", status=400, error=str(e))
                except BrokerError as e:         # an error answer the data layer let through
                    resp = c.render(request, "error.html", status=502, error=str(e))
                except Exception as e:           # a bug: logged with its trace, the page says what failed
                    log.exception("console: %s %s failed", request.method, request.url.path)
                    resp = c.render(request, "error.html", status=500, error=f"internal error: {type(e).__name__}: {e}")
                if new:
                    c.set_cookie(resp, s)
                resp.headers["Content-Security-Policy"] = CSP
                resp.headers["X-Content-Type-Options"] = "nosniff"
                resp.headers["Referrer-Policy"] = "same-origin"
                return resp
            return endpoint

        routes = [
            Route("/", page(self.home)),
            Route("/login", page(self.login_form, login_page=True), methods=["GET"]),
            Route("/login", page(self.login, login_page=True), methods=["POST"]),
            Route("/logout", page(self.logout, login_page=True), methods=["POST"]),
            Route("/cluster", page(self.cluster_page)),
            Route("/topics", page(self.topics_page)),
            Route("/topics", page(self.topic_upsert, write=True), methods=["POST"]),
            Route("/topics/{topic}", page(self.topic_page)),
            Route("/topics/{topic}/delete", page(self.topic_delete, write=True), methods=["POST"]),
            Route("/topics/{topic}/send", page(self.topic_send, write=True), methods=["POST"]),
            Route("/groups", page(self.groups_page)),
            Route("/groups/{group}", page(self.group_page)),
            Route("/groups/{group}/lag.json", page(self.group_lag)),
            Route("/groups/{group}/reset/preview", page(self.reset_preview), methods=["POST"]),
            Route("/groups/{group}/reset/apply", page(self.reset_apply, write=True), methods=["POST"]),
            Route("/messages", page(self.messages_page)),
            Route("/messages/view", page(self.message_page)),
            Route("/messages/resend", page(self.message_resend, write=True), methods=["POST"]),
            Route("/messages/consume-directly", page(self.message_consume_directly, write=True), methods=["POST"]),
            Route("/search", page(self.search_page)),
            Route("/search", page(self.search_start), methods=["POST"]),
            Route("/search/{sid}", page(self.search_job)),
            Route("/search/{sid}/cancel", page(self.search_cancel), methods=["POST"]),
            Route("/tail", page(self.tail_page)),
            Route("/tail/stream", page(self.tail_stream)),
            Route("/acl", page(self.acl_page)),
            Route("/acl", page(self.acl_update, write=True), methods=["POST"]),
            Route("/acl/delete", page(self.acl_delete, write=True), methods=["POST"]),
            Route("/acl/white", page(self.acl_white, write=True), methods=["POST"]),
            Route("/dlq", page(self.dlq_page)),
            Route("/dlq/{group}/export", page(self.dlq_export)),
            Route("/dlq/{group}/resend", page(self.dlq_resend, write=True), methods=["POST"]),
            Mount("/static", StaticFiles(directory=str(HERE / "static")), name="static"),
        ]
        return Starlette(routes=routes, lifespan=self.lifespan)

    @contextlib.asynccontextmanager
    async def lifespan(self, app):
        self._sampler_task = asyncio.ensure_future(self.sampler.run())
        try:
            yield
        finally:
            self._sampler_task.cancel()
            await asyncio.gather(self._sampler_task, return_exceptions=True)
            await self.cluster.close()

    # -- login -------------------------------------------------------------------------------
    async def home(self, request):
        return RedirectResponse("/cluster", status_code=303)

    async def login_form(self, request):
        if self.users is None:
            return RedirectResponse("/cluster", status_code=303)
        return self.render(request, "login.html", next=_safe_next(request.query_params.get("next")))

    async def login(self, request):
        form = dict(await request.form())
        if self.users is None:
            return RedirectResponse("/cluster", status_code=303)
        self.check_csrf(request, form)
        name, password = str(form.get("username", "")), str(form.get("password", ""))
        acct = self.users.get(name)
        # the hash is checked even for an unknown name, so timing does not tell names apart
        ok = auth.verify_password(password, acct.hash if acct else _DUMMY_HASH) and acct is not None
        if not ok:
            log.warning("console: failed login for user %r from %s", name,
                        request.client.host if request.client else "?")
            # 200, the form again: a 401 document would be a console error in the browser
            return self.render(request, "login.html", next=_safe_next(form.get("next")),
                               error="wrong user name or password")
        new = auth.Session(acct.name, acct.role, int(time.time()) + auth.SESSION_TTL_S, secrets.token_hex(16))
        log.info("console: user %s logged in", acct.name)
        resp = RedirectResponse(_safe_next(form.get("next")), status_code=303)
        self.set_cookie(resp, new)
        return resp

    async def logout(self, request):
        self.check_csrf(request, dict(await request.form()))
        resp = RedirectResponse("/login" if self.users is not None else "/cluster", status_code=303)
        resp.delete_cookie(COOKIE, path="/")
        return resp

    # -- cluster -----------------------------------------------------------------------------
    async def cluster_page(self, request):
        return self.render(request, "cluster.html", data=await self.cluster.cluster_page())

    # -- topics ------------------------------------------------------------------------------
    async def topics_page(self, request):
        q = request.query_params.get("q", "")
        show = request.query_params.get("show", "normal")
        names = await self.cluster.topic_names()
        from pocketmq.console.data import topic_kind
        found = [n for n in logic.search_names(names, q) if show == "all" or topic_kind(n) == show]
        pg = logic.paginate(found, _int(request.query_params.get("page"), 1),
                            _int(request.query_params.get("per"), 50))
        rows = await self.cluster.topic_rows(pg.items)
        return self.render(request, "topics.html", rows=rows, page=pg, q=q, show=show)

    async def topic_page(self, request):
        topic = request.path_params["topic"]
        return self.render(request, "topic.html", d=await self.cluster.topic_detail(topic),
                           message=request.query_params.get("m"))

    async def topic_upsert(self, request, form):
        topic = str(form.get("topic", "")).strip()
        err = name_error(TOPIC, "topic", topic)
        if err:
            raise ValueError(err)
        read, write = _int(form.get("read"), 8), _int(form.get("write"), 8)
        if not (1 <= read <= 1024 and 1 <= write <= 1024):
            raise ValueError("queue counts must be 1..1024")
        perm = {"RW": 6, "R": 4, "W": 2}.get(str(form.get("perm", "RW")))
        if perm is None:
            raise ValueError("perm must be RW, R or W")
        brokers = await self.cluster.upsert_topic(topic, read, write, perm, form.get("order") == "on")
        log.info("console: topic %s created/updated on %s", topic, ", ".join(brokers))
        return RedirectResponse(f"/topics/{topic}?m=saved+on+{'+'.join(brokers)}", status_code=303)

    async def topic_delete(self, request, form):
        topic = request.path_params["topic"]
        if form.get("confirm") != topic:
            raise ValueError("type the topic's name to confirm deleting it")
        await self.cluster.delete_topic(topic)
        log.info("console: topic %s deleted", topic)
        return RedirectResponse("/topics", status_code=303)

    async def topic_send(self, request, form):
        topic = request.path_params["topic"]
        r = await self.cluster.send(topic, str(form.get("body", "")).encode("utf-8"), form.get("tags") or None,
                                    form.get("keys") or None)
        return self.render(request, "sent.html", topic=topic, result=r)

    # -- groups ------------------------------------------------------------------------------
    async def groups_page(self, request):
        if not self.sampler.ready.is_set():
            await asyncio.wait_for(self.sampler.ready.wait(), 30)
        q = request.query_params.get("q", "")
        snaps = [self.sampler.latest[g] for g in logic.search_names(self.sampler.latest, q)]
        ordered = logic.sort_groups_by_lag(snaps, lambda s: s.lag)
        pg = logic.paginate(ordered, _int(request.query_params.get("page"), 1),
                            _int(request.query_params.get("per"), 50))
        return self.render(request, "groups.html", page=pg, q=q, interval=self.sampler.interval_s)

    async def group_page(self, request):
        group = request.path_params["group"]
        d = await self.cluster.group_detail(group)
        return self.render(request, "group.html", d=d, interval=self.sampler.interval_s,
                           applied=request.query_params.get("applied"))

    async def group_lag(self, request):
        group = request.path_params["group"]
        return JSONResponse(logic.chart_data(self.history.series(group, self.cluster.clock())))

    def _reset_args(self, form) -> tuple[str, str, int | None]:
        topic = str(form.get("topic", "")).strip()
        mode = str(form.get("mode", ""))
        t = logic.parse_local_time(form.get("time"), None) if mode == "time" else None
        logic.reset_timestamp_ms(mode, t)       # ValueError names what is wrong
        if not topic:
            raise ValueError("choose a topic")
        return topic, mode, t

    async def reset_preview(self, request):
        group = request.path_params["group"]
        form = dict(await request.form())
        self.check_csrf(request, form)      # a read, but a POST: every POST carries the token
        topic, mode, t = self._reset_args(form)
        rows = await self.cluster.reset_preview(group, topic, mode, t)
        replay, skip = logic.preview_totals(rows)
        return self.render(request, "reset_preview.html", group=group, topic=topic, mode=mode, time_ms=t,
                           rows=rows, replay=replay, skip=skip, time_text=form.get("time", ""))

    async def reset_apply(self, request, form):
        group = request.path_params["group"]
        topic, mode, t = self._reset_args(form)
        table = await self.cluster.reset_apply(group, topic, mode, t)
        self.sampler.wake.set()
        return RedirectResponse(f"/groups/{group}?applied={len(table)}", status_code=303)

    # -- messages ----------------------------------------------------------------------------
    async def messages_page(self, request):
        p = request.query_params
        topic, msg_id, key = p.get("topic", "").strip(), p.get("msg_id", "").strip(), p.get("key", "").strip()
        begin, end = logic.parse_local_time(p.get("begin")), logic.parse_local_time(p.get("end"))
        results, note, cut = None, "", False
        if msg_id:
            results = [await self.cluster.by_id(msg_id, topic or None)]
            note = f"message id {msg_id}"
        elif key:
            if not topic:
                raise ValueError("a key lookup needs the topic")
            results = await self.cluster.by_key(topic, key, begin or 0, end)
            note = f"key {key} in {topic}"
        elif topic and p.get("by") == "time":
            limit = max(1, min(_int(p.get("limit"), 50), MAX_LIST))
            results, cut = await self.cluster.by_time(topic, begin, end, limit)
            note = f"the newest {limit} messages of {topic} in the time range"
        topics = [t for t in await self.cluster.topic_names()]
        return self.render(request, "messages.html", results=results, note=note, cut=cut, p=p, topics=topics)

    async def message_page(self, request):
        p = request.query_params
        addr, off = p.get("addr", ""), _int(p.get("offset"), -1)
        if not addr or off < 0:
            raise ValueError("a message is named by its broker address and commit log offset")
        m = await self.cluster.view(addr, off)
        trace = await self.cluster.trace(m)
        groups = (await self.cluster.topic_detail(m.properties.get("RETRY_TOPIC") or m.topic))["groups"]
        # "resend to a group": the online clients of the groups consuming the topic (writes only)
        direct = await self.cluster.groups_clients(groups) if self.can_write(request.state.session) else []
        return self.render(request, "message.html", m=m, body=logic.body_views(m.body), trace=trace, addr=addr,
                           groups=groups, sent=p.get("sent"), direct=direct)

    async def message_resend(self, request, form):
        addr, off = str(form.get("addr", "")), _int(form.get("offset"), -1)
        m = await self.cluster.view(addr, off)
        r = await self.cluster.resend_original(m)
        return self.render(request, "sent.html", topic=r.queue.topic, result=r)

    async def message_consume_directly(self, request, form):
        """One group's one client consumes the message (CONSUME_MESSAGE_DIRECTLY): its listener
        runs on it, nothing is committed, the other groups get nothing."""
        addr, off = str(form.get("addr", "")), _int(form.get("offset"), -1)
        group, _, client_id = str(form.get("target", "")).partition(" ")
        if not group or not client_id:
            raise ValueError("choose a group's client to resend the message to")
        m = await self.cluster.view(addr, off)
        r = await self.cluster.consume_directly(addr, m, group, client_id)
        return self.render(request, "consumed.html", m=m, addr=addr, group=group, client_id=client_id, result=r)

    # -- content search ----------------------------------------------------------------------
    async def search_page(self, request):
        return self.render(request, "search.html", topics=await self.cluster.topic_names(),
                           jobs=list(reversed(self.searches.jobs.values())), max_scan=logic.MAX_SCAN_MESSAGES,
                           default_scan=logic.DEFAULT_SCAN_MESSAGES)

    async def search_start(self, request):
        # a search only reads: it needs the CSRF token (it starts work) but not the admin role
        form = dict(await request.form())
        self.check_csrf(request, form)
        try:
            job = await self.searches.start(str(form.get("topic", "")).strip(), str(form.get("needle", "")),
                                            str(form.get("prop") or "").strip() or None,
                                            logic.parse_local_time(form.get("begin")),
                                            logic.parse_local_time(form.get("end")),
                                            _int(form.get("limit"), logic.DEFAULT_SCAN_MESSAGES))
        except Busy as e:
            raise Refused(503, str(e)) from None
        return RedirectResponse(f"/search/{job.id}", status_code=303)

    async def search_job(self, request):
        job = self.searches.get(request.path_params["sid"])
        if job is None:
            raise Refused(404, "no such search (only the last few are kept)")
        partial = request.headers.get("hx-request") == "true"
        return self.render(request, "search_job.html" if partial else "search_page_job.html", job=job)

    async def search_cancel(self, request):
        self.check_csrf(request, dict(await request.form()))
        self.searches.cancel(request.path_params["sid"])
        return RedirectResponse(f"/search/{request.path_params['sid']}", status_code=303)

    # -- live tail ---------------------------------------------------------------------------
    async def tail_page(self, request):
        p = request.query_params
        return self.render(request, "tail.html", topics=await self.cluster.topic_names(), topic=p.get("topic", ""),
                           expr=p.get("expr", ""), etype=p.get("type", "TAG"))

    async def tail_stream(self, request):
        p = request.query_params
        topic = p.get("topic", "").strip()
        if not topic:
            raise ValueError("choose a topic")
        etype = "SQL92" if p.get("type") == "SQL92" else "TAG"
        expr = p.get("expr", "").strip() or ("*" if etype == "TAG" else "")
        if not expr:
            raise ValueError("an SQL92 filter needs an expression")
        start = parse_positions(p.get("from"))
        await self.cluster.route(topic)        # a missing topic: 404 before the stream starts
        gen = self.tails.stream(topic, expr, etype, start)

        async def events():
            yield ": tail of " + topic.replace("\n", " ") + "\n\n"
            try:
                while True:
                    try:
                        kind, ev = await asyncio.wait_for(gen.__anext__(), 15.0)
                    except asyncio.TimeoutError:
                        yield ": keep-alive\n\n"       # proxies close silent streams
                        continue
                    except Busy as e:
                        yield f"event: failure\ndata: {json.dumps(str(e))}\n\n"
                        return
                    if kind in ("msg", "start"):
                        yield f"event: {kind}\ndata: {json.dumps(ev)}\n\n"
                    else:
                        yield f"event: failure\ndata: {json.dumps(ev)}\n\n"
            finally:
                await gen.aclose()
        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})

    # -- ACL ---------------------------------------------------------------------------------
    async def acl_page(self, request):
        return self.render(request, "acl.html", acl=await self.cluster.acl(), perms=logic.ACL_PERMS,
                           done=request.query_params.get("done"))

    async def acl_update(self, request, form):
        cfg = logic.acl_config_from_form(form)
        done = await self.cluster.acl_write(f"update of ACL account {cfg['accessKey']}",
                                            self.cluster.api.update_acl_config, cfg)
        log.info("console: ACL account %s written to %s", cfg["accessKey"], ", ".join(done))
        return RedirectResponse(f"/acl?done=account+{cfg['accessKey']}+saved", status_code=303)

    async def acl_delete(self, request, form):
        ak = str(form.get("accessKey") or "").strip()
        if not ak or form.get("confirm") != ak:
            raise ValueError("type the access key to confirm deleting the account")
        await self.cluster.acl_write(f"delete of ACL account {ak}", self.cluster.api.delete_acl_config, ak)
        log.info("console: ACL account %s deleted", ak)
        return RedirectResponse(f"/acl?done=account+{ak}+deleted", status_code=303)

    async def acl_white(self, request, form):
        from pocketmq.common.acl import parse_address_pattern
        addrs = [a.strip() for a in str(form.get("addrs") or "").split(",") if a.strip()]
        for a in addrs:
            parse_address_pattern(a)           # ValueError with Java's message
        await self.cluster.acl_write("update of the global white list", self.cluster.api.update_global_white_addrs,
                                     ",".join(addrs))
        return RedirectResponse("/acl?done=white+list+saved", status_code=303)

    # -- DLQ ---------------------------------------------------------------------------------
    async def dlq_page(self, request):
        p = request.query_params
        group = p.get("group", "").strip()
        names = await self.cluster.topic_names()
        dlq_groups = sorted(t[len(DLQ_GROUP_TOPIC_PREFIX):] for t in names if t.startswith(DLQ_GROUP_TOPIC_PREFIX))
        msgs, total = ([], 0)
        limit = max(1, min(_int(p.get("limit"), 50), MAX_LIST))
        if group:
            msgs, total = await self.cluster.dlq(group, limit)
        return self.render(request, "dlq.html", group=group, groups=dlq_groups, msgs=msgs, total=total, limit=limit,
                           resent=p.get("resent"))

    async def dlq_export(self, request):
        group = request.path_params["group"]
        fmt = request.query_params.get("format", "json")
        limit = max(1, min(_int(request.query_params.get("limit"), MAX_LIST), MAX_LIST))
        msgs, _ = await self.cluster.dlq(group, limit)
        rows = [{"msgId": m.msg_id, "topic": m.properties.get("RETRY_TOPIC") or m.topic, "tags": m.tags or "",
                 "keys": " ".join(m.keys), "storeTime": logic.format_ms(m.store_timestamp),
                 "reconsumeTimes": m.reconsume_times, "brokerName": m.broker_name, "queueOffset": m.queue_offset,
                 "body": m.body.decode("utf-8", errors="replace")} for m in msgs]
        name = f"dlq-{group}.{'csv' if fmt == 'csv' else 'json'}"
        disp = {"Content-Disposition": f'attachment; filename="{name}"'}
        if fmt == "csv":
            buf = io.StringIO()
            w = csv.DictWriter(buf, fieldnames=list(rows[0]) if rows else ["msgId"])
            w.writeheader()
            w.writerows(rows)
            return PlainTextResponse(buf.getvalue(), media_type="text/csv", headers=disp)
        return JSONResponse(rows, headers=disp)

    async def dlq_resend(self, request, form):
        group = request.path_params["group"]
        chosen = set((await request.form()).getlist("pick"))     # the form is parsed once, kept
        if not chosen:
            raise ValueError("pick the dead letters to resend")
        msgs, _ = await self.cluster.dlq(group, MAX_LIST)
        sent = 0
        for m in msgs:
            if f"{m.broker_name}:{m.commit_log_offset}" in chosen:
                await self.cluster.resend_original(m)
                sent += 1
        log.info("console: %d dead letters of group %s resent", sent, group)
        return RedirectResponse(f"/dlq?group={group}&resent={sent}", status_code=303)


_DUMMY_HASH = auth.hash_password("not a password", b"pocketmq-console", n=2 ** 14)


def _int(v, default: int) -> int:
    try:
        return int(str(v))
    except (TypeError, ValueError):
        return default


def _safe_next(v) -> str:
    """Only a path of this site (no //host, no scheme) is followed after login."""
    v = str(v or "/cluster")
    return v if v.startswith("/") and not v.startswith("//") and "\\" not in v else "/cluster"


def load_users(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        return auth.parse_users(f.read(), os.path.basename(path))
