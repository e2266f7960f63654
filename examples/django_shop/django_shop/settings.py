"""The shop's settings: one app, one Postgres database (Django's postgresql backend on
psycopg 3, which trioq.producer enqueues through)."""

import os

from psycopg.conninfo import conninfo_to_dict

# DATABASE_URL is a libpq URL or key=value string: postgresql://shop@db.internal/shop
_database = conninfo_to_dict(os.environ["DATABASE_URL"])
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",  # psycopg 3 when it is installed
        "NAME": _database.pop("dbname"),
        "OPTIONS": _database,  # the rest (host, port, user, ...) goes to psycopg as it is
    }
}

INSTALLED_APPS = ["orders"]
MIDDLEWARE: list[str] = []  # a JSON API: no sessions, no cookies, so no CSRF either
ROOT_URLCONF = "django_shop.urls"
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "not-a-secret: the example has no sessions")
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
