import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "recoup.settings")
application = get_wsgi_application()

from sandboxes_app.checks import require_sandbox_provider  # noqa: E402  (needs the app registry)
from sandboxes_app.poll import with_lean_poll  # noqa: E402

require_sandbox_provider()
application = with_lean_poll(application)
