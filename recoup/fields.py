"""Serializer fields that refuse a wrong JSON type instead of coercing it.

DRF's CharField turns 123 into "123" and IntegerField turns "7" into 7; the contract says a known
field with a wrong type is a 400 naming it.
"""

from rest_framework import serializers


class StrictCharField(serializers.CharField):
    def to_internal_value(self, data: object) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictIntegerField(serializers.IntegerField):
    default_error_messages = {"invalid": "A valid integer is required."}

    def to_internal_value(self, data: object) -> int:
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictUUIDField(serializers.UUIDField):
    """Refuses JSON numbers, which DRF would otherwise read as a UUID's integer value."""

    def to_internal_value(self, data: object):
        if not isinstance(data, str):
            self.fail("invalid", value=data)
        return super().to_internal_value(data)


class StrictBooleanField(serializers.BooleanField):
    """Only JSON true and false: DRF would also take "yes", 1 and "on"."""

    default_error_messages = {"invalid": "Must be true or false."}

    def to_internal_value(self, data: object) -> bool:
        if not isinstance(data, bool):
            self.fail("invalid")
        return data
