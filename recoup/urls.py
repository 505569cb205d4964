from django.conf import settings
from django.contrib import admin
from django.urls import include, path, re_path
from django.views.static import serve
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from recoup.errors import api_not_found
from recoup.health import healthz, readyz

# The operator's admin says whose it is (Django's defaults read "Django administration").
admin.site.site_header = "recoup operations"
admin.site.site_title = "recoup admin"
admin.site.index_title = "Sessions, sandboxes and accounts"

urlpatterns = [
    path("healthz", healthz),
    path("readyz", readyz),
    path("admin/", admin.site.urls),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="docs"),
    path("api/", include("sessions_app.urls")),
    path("api/", include("sandboxes_app.urls")),
    re_path(r"^api/", api_not_found),
    path("", include("recoup.console.urls")),
]

if settings.SERVE_STATIC:
    urlpatterns.insert(
        0, re_path(r"^static/(?P<path>.*)$", serve, {"document_root": settings.STATIC_ROOT})
    )
