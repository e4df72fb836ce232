"""``corral ui``: a local web page to review runs, violations, network attempts and previews.

An optional extra (``pip install 'corral[ui]'``: Starlette, uvicorn, Jinja2,
Pygments); nothing here is imported by ``corral run``, the hook or the SDK.
The server listens on loopback only, and every request must carry the
per-start token (see :mod:`corral.ui._guard` for the access rules and
docs/ui.md for the pages).

Example::

    from corral.ui import serve
    serve(state_dir, host="127.0.0.1", port=0, open_browser=False)
"""

from __future__ import annotations

from ._serve import bind, serve

__all__ = ["bind", "serve"]
