"""``trioq stress``: the load tester, a tool built on the library (no library module imports it).

`run` drives a run; ``app`` is the workers' task (``trioq serve --app trioq._stress.app:config``),
``ledger`` its table and timings, ``workers`` the processes, ``load`` the enqueueing,
``monitor`` and ``progress`` the watching, ``chaos`` and ``faults`` the faults and their
recovery times, ``cpu`` the CPU readings, ``verify`` the exactly-once check and ``report`` the
numbers.
"""
