"""`opscope serve`: the web analyzer over every run in the store."""
from __future__ import annotations

from opscope.runtime.errors import UsageError

from .profile import check_port


def register(sub) -> None:
    p = sub.add_parser("serve", help="open the web analyzer over every run in the store")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1; any other address needs --token, or one is generated)")
    p.add_argument("--port", type=int, default=8050, help="port (default 8050)")
    p.add_argument("--token", default=None, help="a secret every request must carry (?token=, then a cookie)")
    p.add_argument("--run", default=None, help="open this run's timeline first")
    p.add_argument("--open", action="store_true", help="open the page in a browser")
    p.set_defaults(func=main)


def main(args) -> int:
    check_port(args.host, args.port)
    from opscope.app.web.server import serve
    run_id = None
    if args.run:
        from opscope.profiler.store import RunStore
        run_id = RunStore().get_run(args.run)["run_id"]     # unknown ids fail here, with a message
    try:
        serve(run_id=run_id, host=args.host, port=args.port, token=args.token, open_browser=args.open)
    except OSError as e:
        raise UsageError(f"cannot listen on {args.host}:{args.port}: {e.strerror or e}; pick another --port")
    return 0
