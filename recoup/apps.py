from django.apps import AppConfig


class RecoupConfig(AppConfig):
    """The project package as an app, for its management commands (`up`)."""

    name = "recoup"
    label = "recoup"
