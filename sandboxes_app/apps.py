from django.apps import AppConfig


class SandboxesAppConfig(AppConfig):
    name = "sandboxes_app"
    default_auto_field = "django.db.models.BigAutoField"
    verbose_name = "Sandboxes"
