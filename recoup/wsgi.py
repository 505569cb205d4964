import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "recoup.settings")
application = get_wsgi_application()

from sandboxes_app.checks import require_sandbox_provider  # noqa: E402  (needs the app registry)

require_sandbox_provider()
