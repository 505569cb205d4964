from django.apps import AppConfig


class ConsoleConfig(AppConfig):
    name = "recoup.console"
    label = "console"
    verbose_name = "Console"
