"""`trioq.Config` and `trioq.QueueConfig`: every field validated at construction, the error
naming the field (``docs/configuration.md`` lists the rules)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

import trioq
from trioq import CronEntry


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"heartbeat_interval": 20, "lease": 30}, "heartbeat_interval"),
        ({"lease": -1}, "lease must be a positive finite number"),
        ({"lease": float("inf")}, "lease must be a positive finite number"),
        ({"pool_size": 2.5}, "pool_size must be a positive int"),
        ({"queues": {"q": trioq.QueueConfig(concurrency=1)}, "sync_threads": 0}, "sync_threads"),
        ({"queues": {"bad name": trioq.QueueConfig()}}, "queue name"),
        ({"shutdown_grace": -1}, "shutdown_grace must be a finite number, not negative"),
        ({"schema": "Bad"}, "schema name"),
        ({"registry": object()}, "registry must be a trioq.Registry"),
    ],
)
def test_config_errors_name_the_field(options: dict[str, Any], message: str) -> None:
    with pytest.raises((ValueError, TypeError), match=message):
        trioq.Config(**{"registry": trioq.Registry(), **options})


def test_config_refuses_a_trailing_newline() -> None:
    """``re.match`` with ``$`` accepts ``"q\\n"``: these validators use ``fullmatch``."""
    with pytest.raises(ValueError, match="queue name 'q\\\\n' is invalid"):
        trioq.Config(registry=trioq.Registry(), queues=["q\n"])
    with pytest.raises(ValueError, match="schema name"):
        trioq.Queue(schema="trioq\n")


def test_bad_cron_fails_when_the_config_is_built() -> None:
    """Schedules, zones and fields: ``tests/test_cron.py::test_validation_names_entry_and_field``.
    Here: what the Config adds."""
    entry = CronEntry(name="nightly", schedule="0 3 * * *", task="t")
    with pytest.raises(ValueError, match="cron entry 'nightly': schedule '61 \\* \\* \\* \\*'"):
        CronEntry(name="nightly", schedule="61 * * * *", task="t")
    with pytest.raises(ValueError, match="never matches"):
        CronEntry(name="never", schedule="0 0 30 2 *", task="t")
    with pytest.raises(TypeError, match=r"cron must be a sequence of trioq\.CronEntry, got str"):
        trioq.Config(registry=trioq.Registry(), cron="0 3 * * *")
    with pytest.raises(TypeError, match=r"cron entries must be trioq\.CronEntry"):
        trioq.Config(registry=trioq.Registry(), cron=["0 3 * * *"])
    with pytest.raises(ValueError, match="cron entry names must be unique"):
        trioq.Config(registry=trioq.Registry(), cron=[entry, entry])
    assert trioq.Config(registry=trioq.Registry(), cron=entry).cron == (entry,)


def test_cron_args_over_the_payload_limit_are_refused() -> None:
    entry = trioq.CronEntry(name="big", schedule="* * * * *", task="t", args={"x": "y" * 100})
    with pytest.raises(ValueError, match=r"cron entry 'big'.*max_payload_bytes"):
        trioq.Config(registry=trioq.Registry(), cron=[entry], max_payload_bytes=50)


def test_intervals_take_timedeltas_and_queues_take_names() -> None:
    config = trioq.Config(
        registry=trioq.Registry(), lease=dt.timedelta(minutes=1), queues=["a", "b"],
        heartbeat_interval=dt.timedelta(seconds=2),
    )  # fmt: skip
    assert (config.lease, config.heartbeat_interval) == (60.0, 2.0)
    assert config.queues == {"a": trioq.QueueConfig(), "b": trioq.QueueConfig()}
    assert trioq.Config(registry=trioq.Registry(), queues="email").queues == {
        "email": trioq.QueueConfig()
    }


def test_served_queues_default_to_the_tasks_queues() -> None:
    tasks = trioq.Registry()
    tasks.task(name="a", queue="mail")(lambda job: None)
    tasks.task(name="b", queue="sms")(lambda job: None)
    assert set(trioq.Config(registry=tasks).served_queues()) == {"mail", "sms"}
    assert set(trioq.Config(registry=trioq.Registry()).served_queues()) == {"default"}
    assert set(trioq.Config(registry=tasks, queues=["x"]).served_queues()) == {"x"}


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"pool_size": "8"}, TypeError, "pool_size must be a positive int"),
        ({"pool_size": 0}, ValueError, "pool_size must be a positive int"),
        ({"max_payload_bytes": 1.5}, TypeError, "max_payload_bytes must be an int"),
        ({"max_payload_bytes": 0}, ValueError, "max_payload_bytes must be positive"),
        ({"queues": {5: trioq.QueueConfig()}}, TypeError, "queues: queue name must be a string"),
        ({"queues": {"q": 5}}, TypeError, r"queues\['q'\] must be a QueueConfig"),
        ({"schema": 5}, TypeError, "schema name must be a string"),
    ],
)
def test_one_error_type_per_rule(
    options: dict[str, Any], error: type[Exception], message: str
) -> None:
    """A value of the wrong type is a TypeError, a bad value of the right type a ValueError."""
    with pytest.raises(error, match=message):
        trioq.Config(**{"registry": trioq.Registry(), **options})


def test_queue_config_concurrency() -> None:
    assert trioq.QueueConfig().concurrency == 10
    with pytest.raises(ValueError, match="concurrency must be a positive int"):
        trioq.QueueConfig(concurrency=0)
    with pytest.raises(TypeError, match="concurrency must be a positive int"):
        trioq.QueueConfig(concurrency=True)


def test_the_repr_never_shows_a_password() -> None:
    config = trioq.Config(registry=trioq.Registry(), dsn="postgresql://app:s3cret@db/app")
    assert "s3cret" not in repr(config)
    assert "postgresql://app@db:5432/app" in repr(config)


def test_session_dsn_and_prepared_statements_are_validated() -> None:
    registry = trioq.Registry()
    config = trioq.Config(registry=registry, dsn="postgresql://app@pgbouncer:6432/app",
                          session_dsn="postgresql://app:s3cret@db/app")  # fmt: skip
    assert "s3cret" not in repr(config) and "session_dsn='postgresql://app@db" in repr(config)
    assert config.prepared_statements is None  # decided with the session DSN: docs/pooling.md
    for bad in ("postgresql://app:s3cret@db/app?bogus=1", "host=db\x00", "\udcff", 5):
        with pytest.raises(ValueError, match="session_dsn") as raised:
            trioq.Config(registry=registry, session_dsn=bad)  # type: ignore[arg-type]
        assert "s3cret" not in str(raised.value)
    for flag in (1, 0, "no", "false"):
        with pytest.raises(TypeError, match="prepared_statements must be True, False or None"):
            trioq.Config(registry=registry, prepared_statements=flag)  # type: ignore[arg-type]
    assert trioq.Config(registry=registry, prepared_statements=False).prepared_statements is False
