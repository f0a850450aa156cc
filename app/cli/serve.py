"""`opscope serve [FOLDER]`: the web analyzer over every run in the store, or over the jobs of a shared
folder (`train --hybrid --shared-dir`), imported into a private store that lives as long as the server."""
from __future__ import annotations

import os
import shutil
import sys
import tempfile

from opscope.runtime.errors import UsageError, terminal_text
from opscope.runtime.home import HOME_ENV

from .common import port_arg


def register(sub) -> None:
    p = sub.add_parser("serve", help="open the web analyzer over every run in the store",
                       description="Serve the web analyzer. It binds 127.0.0.1 unless --host says otherwise. Every "
                                   "request needs a token, on loopback too (other users of the machine can reach "
                                   "127.0.0.1): one is generated and the URL printed carries it, or set it with "
                                   "OPSCOPE_TOKEN or --token-file; --no-token turns it off on loopback only.")
    p.add_argument("folder", nargs="?", default=None,
                   help="a --shared-dir folder of per-rank Parquet: serve its jobs (each one run) from a private "
                        "temporary store, deleted when the server stops, instead of the store in OPSCOPE_HOME")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1). Only 127.0.0.1, ::1 and localhost count as loopback: "
                        "any other address (127.0.0.2 too) refuses --no-token")
    p.add_argument("--port", type=port_arg(), default=8050, help="port (default 8050)")
    add_token_options(p)
    p.add_argument("--run", default=None, help="open this run's timeline first")
    p.add_argument("--open", action="store_true", help="open the page in a browser")
    p.set_defaults(func=main)


def add_token_options(p) -> None:
    """--token-file, --token, --no-token and --allow-host: the same for `serve` and `profile --web`."""
    p.add_argument("--token-file", default=None, metavar="PATH",
                   help="read the access token from this file (mode 600); or set OPSCOPE_TOKEN; else one is "
                        "generated. Every request needs it (?token= once, then a cookie)")
    p.add_argument("--token", default=None,
                   help="the access token on the command line (other users can see it in `ps`: prefer "
                        "OPSCOPE_TOKEN or --token-file)")
    p.add_argument("--show-token", action="store_true",
                   help="print the URL with the token even when it came from OPSCOPE_TOKEN or --token-file (by "
                        "default it is left out of the output then: a container's log is read by more people)")
    p.add_argument("--no-token", action="store_true",
                   help="no token at all, for a machine no one else logs in to: any local user can then read every "
                        "run. Loopback only; OPSCOPE_TOKEN is then ignored")
    p.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                   help="a host name browsers may use to reach the server besides --host and localhost "
                        "(a DNS name, a proxy); repeatable. Other Host headers are refused (DNS rebinding)")


def token_from(args) -> str | None:
    """The token the server will need (--token, --token-file, else OPSCOPE_TOKEN, else a new one; None with
    --no-token), checked before anything starts."""
    from opscope.app.web.gate import server_token
    token = server_token(args.host, args.token, args.token_file, args.no_token)
    if args.token is not None:
        print("opscope: note: --token is visible to other users in `ps`; prefer OPSCOPE_TOKEN or --token-file",
              file=sys.stderr)
    return token


def token_in_url(args) -> bool:
    """Whether the printed URL may carry the token: yes when opscope made it (the URL is the only way to learn it)
    or it is on the command line anyway; not when it came from OPSCOPE_TOKEN or a file (a deployment's secret,
    and a container's log is read by more people than the secret), unless --show-token."""
    from opscope.app.web.gate import TOKEN_ENV
    from_secret = args.token is None and (args.token_file is not None or bool(os.environ.get(TOKEN_ENV)))
    return args.show_token or not from_secret


def main(args) -> int:
    from .profile import check_port      # here, so that profile.py can import add_token_options from this module
    check_port(args.host, args.port)
    token = token_from(args)
    if args.folder is None:
        return _serve(args, token)
    home = _private_home()
    try:
        _import_folder(args.folder, home)
        return _serve(args, token)
    finally:
        shutil.rmtree(home, ignore_errors=True)


def _private_home() -> str:
    """A temporary OPSCOPE_HOME for this process, set before any store is made (mkdtemp: mode 0700)."""
    home = tempfile.mkdtemp(prefix="opscope-serve-")
    os.environ[HOME_ENV] = home
    return home


def _import_folder(folder: str, home: str) -> None:
    from opscope.profiler.shared import import_shared
    from opscope.profiler.store import RunStore
    store = RunStore()
    run_ids = import_shared(folder, store)
    print(f"serving {len(run_ids)} run(s) from {os.path.abspath(folder)} (imported into {home}, deleted when the "
          f"server stops):", flush=True)
    for rid in run_ids:
        run = store.get_run(rid)
        print(terminal_text(f"  {rid}  {run.get('model')}  {run['config'].get('world_size')} ranks  "
                            f"{run.get('status')}" + (f"  ({run['error']})" if run.get("error") else "")), flush=True)


def _serve(args, token) -> int:
    from opscope.app.web.server import serve
    run_id = None
    if args.run:
        from opscope.profiler.store import RunStore
        run_id = RunStore().get_run(args.run)["run_id"]     # unknown ids fail here, with a message
    try:
        serve(run_id=run_id, host=args.host, port=args.port, token=token, open_browser=args.open,
              token_in_url=token_in_url(args),
              allow_hosts=args.allow_host, no_token=args.no_token)
    except OSError as e:
        raise UsageError(f"cannot listen on {args.host}:{args.port}: {e.strerror or e}; pick another --port")
    raise KeyboardInterrupt   # serve() blocks until Ctrl-C (or SIGTERM): it ends as an interrupt (exit 130, one line)
