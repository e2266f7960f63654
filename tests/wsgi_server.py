"""``python wsgi_server.py MODULE:ATTRIBUTE``: serve that WSGI application on 127.0.0.1, on
a port the system picks, which it prints (one line) before serving.

tests/test_framework_examples.py runs the Django example in it, as a deployment runs Django
(gunicorn, uWSGI): a process of its own, since Django's settings are the process's.
"""

from __future__ import annotations

import importlib
import sys
from wsgiref.simple_server import make_server


def main() -> None:
    module, _, attribute = sys.argv[1].partition(":")
    application = getattr(importlib.import_module(module), attribute)
    with make_server("127.0.0.1", 0, application) as server:
        print(server.server_port, flush=True)
        server.serve_forever()


if __name__ == "__main__":
    main()
