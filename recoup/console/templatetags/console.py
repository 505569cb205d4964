from datetime import UTC, datetime

from django import template

register = template.Library()


@register.filter
def utc_ms(value: datetime | None) -> str:
    """`2025-01-02 03:04:05.678`, in UTC: lifecycle steps are often milliseconds apart."""
    if value is None:
        return ""
    value = value.astimezone(UTC)
    return f"{value:%Y-%m-%d %H:%M:%S}.{value.microsecond // 1000:03d}"
