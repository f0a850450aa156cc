"""The web analyzer: a Dash app over the run store (issue 4). `create_app` builds it, `serve`
runs it; the pages live in opscope.app.pages, one module each."""
from .server import create_app, serve

__all__ = ["create_app", "serve"]
