from django.apps import AppConfig


class AccountsConfig(AppConfig):
    name = "recoup.accounts"
    label = "accounts"
    default_auto_field = "django.db.models.BigAutoField"
    verbose_name = "Accounts"
