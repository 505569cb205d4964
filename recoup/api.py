"""Helpers shared by the API views."""

from rest_framework.exceptions import ValidationError


def validated(serializer_class: type, data: object) -> dict:
    """Validate a request body or query dict with `serializer_class`; 400 unless it is an object
    whose fields pass."""
    if not isinstance(data, dict):
        raise ValidationError("Request body must be a JSON object")
    serializer = serializer_class(data=data)
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data
