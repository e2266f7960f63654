"""The ``trioq`` command line (a tool built on the library; no library module imports it).

`main` parses the arguments and runs one command: ``main.py`` has the parser and the
error handling, and each command group has its own module (``serve``, ``ops``, ``db``,
``demo``, ``stress``; ``supervisor`` runs ``serve --processes N``).
"""

from .main import main as main

__all__ = ["main"]
