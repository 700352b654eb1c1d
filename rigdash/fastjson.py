"""JSON through orjson: what DjangoJSONEncoder formats (dates, times, decimals, UUIDs, lazy strings) is handed back
to it, so the text is Django's; a non-finite float is ``null`` (json.dumps writes ``NaN``, which ``JSON.parse``
refuses). For the responses and pages that carry long series, where json.dumps was most of the request's time."""

from __future__ import annotations

from typing import Any

import orjson
from django.core.serializers.json import DjangoJSONEncoder
from django.http import HttpResponse

_OPTIONS = orjson.OPT_NON_STR_KEYS | orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS
_default = DjangoJSONEncoder().default


def dumps(value: Any) -> bytes:
    return orjson.dumps(value, default=_default, option=_OPTIONS)


class FastJsonResponse(HttpResponse):
    """``JsonResponse`` for a dict, written by ``dumps``."""

    def __init__(self, data: dict[str, Any], **kwargs: Any) -> None:
        kwargs.setdefault("content_type", "application/json")
        super().__init__(dumps(data), **kwargs)
