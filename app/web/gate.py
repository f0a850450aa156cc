"""Who may ask the web server what: the Host check, the token gate, and the shape of callback requests.

    token = server_token(host, flag, token_file)  # --token, else --token-file, else $OPSCOPE_TOKEN, else a new one
    install(app, host="127.0.0.1", token=token)  # create_app does this

Each request passes, in order:
1. Host: a browser page on a rebinding domain (evil.example resolving to 127.0.0.1) reaches a loopback
   server with `Host: evil.example`. Only the names this server was bound as (and the loopback names)
   are answered; the port is not checked, so `ssh -L 9000:localhost:8050` still works.
2. Token (when set): `?token=` once, then a cookie named after the server's port, holding not the token
   but an HMAC of it and the port, so a cookie never unlocks another opscope server on the same host.
3. Callback requests: a POST to /_dash-update-component must name a callback and send exactly its
   declared inputs and state, each value what inputs.SCHEMA says that component's property holds, and
   nothing anywhere in it that is not text (a lone surrogate) or past the size bounds (inputs.check_request).
A refusal is one line of text/plain; BadInput anywhere becomes a 400 of one line.
"""
from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import secrets
import socket
import stat
from pathlib import Path

from opscope.runtime.errors import UsageError

from . import inputs
from .inputs import BadInput

TOKEN_ENV = "OPSCOPE_TOKEN"
TOKEN_HEADER = "X-Opscope-Token"
COOKIE_PREFIX = "opscope_token_"
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
WILDCARDS = frozenset({"0.0.0.0", "::", ""})
MAX_BODY = 16 * 2**20          # bytes: a callback body carries ids and filters; past this, 413
_HEADERS = {"Referrer-Policy": "no-referrer", "X-Content-Type-Options": "nosniff", "X-Frame-Options": "DENY"}


# --- where the token comes from ---------------------------------------------------------------

def resolve_token(token: str | None = None, token_file: str | os.PathLike | None = None) -> str | None:
    """The server's token: --token, else --token-file, else $OPSCOPE_TOKEN; None when none is set.

    A command line is readable by every local user (`ps`), so the file and the variable are the ways to prefer."""
    if token is not None and token_file is not None:
        raise UsageError("give the token one way: --token or --token-file")
    if token_file is not None:
        return read_token_file(token_file)
    token = token if token is not None else os.environ.get(TOKEN_ENV)
    if token is None or token == "":
        return None
    return _checked(token, "the token")


def server_token(host: str, token: str | None = None, token_file=None, no_token: bool = False) -> str | None:
    """The token a server bound to `host` requires: the one given (resolve_token), else a new random one, the way
    Jupyter does: on a shared machine every local user can reach 127.0.0.1, so loopback needs one too.

    no_token: the explicit opt-out for a single-user machine; refused off loopback, and beside a given token."""
    if no_token:
        if token is not None or token_file is not None:
            raise UsageError("--no-token and a token (--token, --token-file): give one or the other")
        if not is_loopback(host):
            raise UsageError(f"--no-token: {host} is not loopback (only {', '.join(sorted(LOOPBACK_NAMES))} are), so "
                             "every request needs the token; drop --no-token")
        return None
    return resolve_token(token, token_file) or secrets.token_urlsafe()


def is_loopback(host: str) -> bool:
    """Only this machine's own loopback names: any other address, 127.0.0.2 included, is treated as reachable
    from elsewhere (another interface, a container, a forwarded port)."""
    name = _norm(host)
    try:
        name = str(ipaddress.ip_address(name))         # 0:0:0:0:0:0:0:1 is ::1
    except ValueError:
        pass
    return name in LOOPBACK_NAMES


def read_token_file(path) -> str:
    """The token in `path` (surrounding whitespace dropped); refused when other users can read the file."""
    p = Path(path).expanduser()
    try:
        st = p.stat()
        if os.name == "posix" and st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise UsageError(f"--token-file {p}: other users can read it (mode {stat.S_IMODE(st.st_mode):04o}); "
                             f"run `chmod 600 {p}`")
        text = p.read_text(encoding="utf-8").strip()
    except UnicodeDecodeError:
        raise UsageError(f"--token-file {p}: not a text file")
    except OSError as e:
        raise UsageError(f"--token-file {p}: {e.strerror or e}")
    if not text:
        raise UsageError(f"--token-file {p} is empty: put the token on its first line")
    return _checked(text, f"the token in {p}")


def _checked(token: str, what: str) -> str:
    if any(c.isspace() for c in token) or not token.isprintable():
        raise UsageError(f"{what} has spaces or control characters: use one word, e.g. "
                         "`python -c 'import secrets; print(secrets.token_urlsafe())'`")
    return token


HEALTH_PATH = "/healthz"


# --- the checks --------------------------------------------------------------------------------

def install(app, host: str = "127.0.0.1", token: str | None = None, allow_hosts=()) -> None:
    """Put the Host check, the token gate (when `token`) and the callback-request check in front of `app`."""
    from flask import g, request

    server = app.server
    server.config["MAX_CONTENT_LENGTH"] = MAX_BODY
    hosts = allowed_hosts(host, allow_hosts)
    any_ip = host.strip("[]").lower() in WILDCARDS

    @server.before_request
    def _gate():
        given = request.environ.get("HTTP_HOST")
        # No Host at all is no browser (browsers always send one): nothing a rebinding page can do.
        if given is not None and not host_allowed(given, hosts, any_ip):
            return refusal(403, f"Host {given[:100]!r} is not a name this server answers to ({host_list(hosts)}); "
                                "open it by one of those, or start it with --allow-host NAME")
        if request.path == HEALTH_PATH and request.method in ("GET", "HEAD"):
            # A liveness answer carries nothing a token protects, so a probe that does not know the token
            # (the server made its own) still tells a dead server from a live one -- and a 403 stays a failure.
            return "ok\n", 200, {"Content-Type": "text/plain; charset=utf-8", "Cache-Control": "no-store"}
        if token:
            port = request.environ.get("SERVER_PORT", "")
            if not _has_token(request, token, port):
                return refusal(403, "this opscope server needs its token: open the URL `opscope serve` printed "
                                    "(with ?token=...), or send the X-Opscope-Token header")
            g.opscope_cookie = (cookie_name(port), cookie_value(token, port)) if "token" in request.args else None
        if request.method == "POST" and request.path.endswith("/_dash-update-component"):
            try:
                body = request.get_json(silent=True)       # parsed once: Dash reads the same (cached) document
            except RecursionError:                         # [[[[...: Python's parser recurses per level
                raise BadInput("the callback request is nested too deep")
            check_callback_request(app, body)

    @server.after_request
    def _headers(resp):
        if token and g.get("opscope_cookie"):
            name, value = g.opscope_cookie
            resp.set_cookie(name, value, httponly=True, samesite="Strict", path="/")
        for k, v in _HEADERS.items():
            resp.headers.setdefault(k, v)
        return resp

    @server.errorhandler(BadInput)
    def _bad_input(e):
        return refusal(400, str(e))


def refusal(status: int, message: str):
    reason = {400: "bad request", 403: "forbidden"}[status]
    line = " ".join(str(message).split())
    return f"{status} {reason}: {line}\n", status, {"Content-Type": "text/plain; charset=utf-8"}


# --- Host --------------------------------------------------------------------------------------

def allowed_hosts(host: str, extra=()) -> frozenset:
    """The names a server bound to `host` answers to: the loopback names, `host` itself and `extra`;
    bound to every interface (0.0.0.0, ::), also this machine's host names."""
    names = set(LOOPBACK_NAMES) | {_norm(h) for h in (host, *extra) if h}
    if host.strip("[]").lower() in WILDCARDS:
        names |= {_norm(socket.gethostname()), _norm(socket.getfqdn())}
    return frozenset(n for n in names if n not in WILDCARDS)


def host_allowed(header: str, hosts: frozenset, any_ip: bool = False) -> bool:
    """Whether a Host header ("name", "name:port", "[v6]:port") names this server.

    any_ip: bound to every interface, any IP literal is one of ours (or a proxy's): a rebinding page
    always comes with a domain name, never an address."""
    name = host_name(header)
    if name in hosts:
        return True
    if any_ip:
        try:
            ipaddress.ip_address(name)
            return True
        except ValueError:
            return False
    return False


def host_name(header: str) -> str:
    h = header.strip()
    if h.startswith("["):                       # [::1]:8050
        return _norm(h[1:h.find("]")] if "]" in h else h[1:])
    if h.count(":") == 1:                      # name:port (a bare IPv6 address has several colons)
        h = h.split(":")[0]
    return _norm(h)


def _norm(name: str) -> str:
    return name.strip().strip("[]").lower().rstrip(".")


def host_list(hosts: frozenset) -> str:
    shown = sorted(hosts)
    return ", ".join(shown[:6]) + (f" and {len(shown) - 6} more" if len(shown) > 6 else "")


# --- token -------------------------------------------------------------------------------------

def cookie_name(port: str) -> str:
    """Cookies ignore ports: servers on one host share them. Naming it after the port keeps them apart."""
    return f"{COOKIE_PREFIX}{port}"


def cookie_value(token: str, port: str) -> str:
    """What the cookie holds: proof of the token for this port, not the token (useless on ?token= or elsewhere)."""
    return hmac.new(token.encode(), f"opscope-cookie:{port}".encode(), hashlib.sha256).hexdigest()


def _has_token(request, token: str, port: str) -> bool:
    auth = request.headers.get("Authorization", "")
    given = request.args.get("token") or request.headers.get(TOKEN_HEADER) or \
        (auth[7:] if auth.startswith("Bearer ") else None)
    if given is not None:
        return hmac.compare_digest(given.encode(), token.encode())
    cookie = request.cookies.get(cookie_name(port))
    return cookie is not None and hmac.compare_digest(cookie.encode(), cookie_value(token, port).encode())


# --- callback requests -------------------------------------------------------------------------

def check_callback_request(app, body) -> None:
    """A /_dash-update-component body names a server-side callback and sends exactly its inputs and state,
    in order, as the Dash renderer does; BadInput otherwise (Dash itself would answer 500)."""
    if not isinstance(body, dict):
        raise BadInput("a callback request is a JSON object")
    inputs.check_request(body, "the callback request")
    output = body.get("output")
    cb = app.callback_map.get(output) if isinstance(output, str) else None
    if cb is None:
        raise BadInput(f"no callback has the output {str(output)[:80]!r}")
    if "callback" not in cb:
        raise BadInput(f"{output[:80]!r} is a clientside callback: the browser runs it")
    declared = cb["output"] if isinstance(cb["output"], list) else [cb["output"]]
    _same_ids("outputs", body.get("outputs"), [(o.component_id, o.component_property) for o in declared],
              single=not isinstance(cb["output"], list))
    for part in ("inputs", "state"):
        given = body.get(part, [])
        _same_ids(part, given, [(d["id"], d["property"]) for d in cb[part]])
        for item in given:
            value = item.get("value")
            inputs.check_input(item["id"], item["property"], value)
            prefix = app.config.requests_pathname_prefix
            if item["property"] == "pathname" and value is not None and not value.startswith(prefix):
                raise BadInput(f"{item['id']}.pathname must start with {prefix}")
    changed = body.get("changedPropIds", [])
    if not isinstance(changed, list) or not all(isinstance(c, str) for c in changed):
        raise BadInput("changedPropIds must be a list of strings")


def _same_ids(part: str, given, expected: list, single: bool = False) -> None:
    if single and isinstance(given, dict):
        given = [given]
    if not isinstance(given, list) or len(given) != len(expected):
        raise BadInput(f"{part}: this callback takes {len(expected)}")
    for item, (cid, prop) in zip(given, expected):
        if not isinstance(item, dict) or item.get("id") != cid or item.get("property") != prop:
            raise BadInput(f"{part}: expected {cid}.{prop} here")
