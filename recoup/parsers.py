"""The API's JSON parser: DRF's, refusing JSON nested past MAX_DEPTH before it is decoded.

Python's json decoder recurses once per array or object, so a body of 100k `[` was a
RecursionError (a 500). A linear scan measures the depth first, without recursion.
"""

import io
import re
from itertools import accumulate
from typing import Any

from django.conf import settings
from rest_framework import parsers
from rest_framework.exceptions import ParseError

# The contract's deepest body is three levels; 64 leaves clients room for their own extra
# fields and stays far below the interpreter's recursion limit (1000).
MAX_DEPTH = 64

# What is not structure: a whole string (brackets inside it, escaped quotes included, do not
# count; one never closed runs to the end, so no quote is scanned twice) or a run of anything
# else that is not a bracket.
_NOT_STRUCTURE = re.compile(r'"[^"\\]*(?:\\.?[^"\\]*)*(?:"|\Z)|[^"\[\]{}]+', re.DOTALL)
_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


def json_too_deep(text: str, *, limit: int = MAX_DEPTH) -> bool:
    """Whether `text` has more than `limit` arrays and objects open at once: one linear pass."""
    if text.count("[") + text.count("{") <= limit:
        return False  # the common case: too few brackets to matter, no scan
    brackets = _NOT_STRUCTURE.sub("", text)
    return max(accumulate(map(_STEP.__getitem__, brackets)), default=0) > limit


class JSONParser(parsers.JSONParser):
    """DRF's JSONParser with a depth limit: past MAX_DEPTH, a 400 naming the limit."""

    def parse(
        self, stream: Any, media_type: str | None = None, parser_context: dict | None = None
    ) -> Any:
        raw = stream.read()
        encoding = (parser_context or {}).get("encoding", settings.DEFAULT_CHARSET)
        try:
            text = raw.decode(encoding)
        except (LookupError, UnicodeError):
            text = ""  # not text in that charset: the parent parser reports it as it always has
        if json_too_deep(text):
            raise ParseError(f"JSON nested deeper than {MAX_DEPTH} levels")
        return super().parse(io.BytesIO(raw), media_type, parser_context)
