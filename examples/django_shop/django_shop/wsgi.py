"""The WSGI application, for gunicorn, uWSGI or mod_wsgi: ``django_shop.wsgi:application``."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "django_shop.settings")
application = get_wsgi_application()
