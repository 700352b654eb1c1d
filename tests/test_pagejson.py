"""``json_data`` (rigdash/templatetags/pagejson.py) against Django's ``json_script``: the same data read back, nothing
that closes the script element, and a page's figures rendered through it."""

from __future__ import annotations

import json
import re
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from uuid import UUID

from django.http import JsonResponse
from django.template import Context, Template
from django.utils.html import json_script
from django.utils.translation import gettext_lazy

from rigdash.fastjson import FastJsonResponse
from rigdash.templatetags.pagejson import json_data

HOSTILE = {
    "model": "</script><script>alert(1)</script><!-- & -->",
    "reply": "a <b>bold</b> & 'quoted' \"text\" \u2028\u2029 ünïcødé 🙂",
    "at": datetime(2026, 12, 5, 23, 0, 1, 123456, tzinfo=UTC),
    "day": date(2026, 12, 5),
    "took": timedelta(seconds=3.5),
    "price": Decimal("1.10"),
    "id": UUID("12345678-1234-5678-1234-567812345678"),
    "label": gettext_lazy("Chats"),
    7: [1, 2.5, None, True, (3, 4)],
}


def _inner(html: str) -> str:
    found = re.fullmatch(r'<script id="cfg" type="application/json">(.*)</script>', html, re.DOTALL)
    assert found, html
    return found.group(1)


def test_it_reads_back_as_django_json_script_does_and_never_closes_the_element():
    ours, django = _inner(json_data(HOSTILE, "cfg")), _inner(json_script(HOSTILE, "cfg"))
    assert json.loads(ours) == json.loads(django)
    for text in (ours,):
        assert "<" not in text and ">" not in text and "&" not in text


def test_a_non_finite_float_is_null_not_the_nan_json_parse_refuses():
    assert json.loads(_inner(json_data({"tps": float("nan"), "bound": float("inf")}, "cfg"))) == {
        "tps": None,
        "bound": None,
    }


def test_templates_have_it_without_a_load_tag():
    html = Template('{{ figures|json_data:"usage-figures" }}').render(Context({"figures": {"x": "<&>"}}))
    assert html == '<script id="usage-figures" type="application/json">{"x":"\\u003C\\u0026\\u003E"}</script>'


def test_the_fast_json_response_reads_back_as_django_json_response_does():
    hostile = {str(key): value for key, value in HOSTILE.items()}
    ours, django = FastJsonResponse(hostile), JsonResponse(hostile)
    assert ours["Content-Type"] == django["Content-Type"] == "application/json"
    assert json.loads(ours.content) == json.loads(django.content)
    assert json.loads(FastJsonResponse({"tps": float("nan")}).content) == {"tps": None}
