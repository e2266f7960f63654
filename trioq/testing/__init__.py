"""trioq.testing: test your own tasks without running a worker (``docs/testing.md``).

Importable without pytest; the pytest fixtures are the plugin ``trioq.testing.pytest``
(``pytest_plugins = ["trioq.testing.pytest"]`` in your root ``conftest.py``).

- a database: `ThrowawayPostgres` (a throwaway server, a fresh migrated database per test);
- running jobs: `drain` (inline, through the runtime's own execution code), `DrainResult`,
  `Run`, and the SQL clock: `set_clock`, `advance_clock`, `reset_clock`;
- assertions: `assert_enqueued`, `refute_enqueued`, `enqueued_jobs`;
- unit tests of one handler: `job_context`, `call`.
"""

from .._exceptions import DrainLimitError as DrainLimitError
from .._metadata import fixup_module_metadata
from ._context import call as call
from ._context import job_context as job_context
from ._drain import DrainResult as DrainResult
from ._drain import Run as Run
from ._drain import advance_clock as advance_clock
from ._drain import drain as drain
from ._drain import reset_clock as reset_clock
from ._drain import set_clock as set_clock
from ._jobs import assert_enqueued as assert_enqueued
from ._jobs import enqueued_jobs as enqueued_jobs
from ._jobs import refute_enqueued as refute_enqueued
from ._postgres import ThrowawayPostgres as ThrowawayPostgres

fixup_module_metadata(__name__, globals())
del fixup_module_metadata
