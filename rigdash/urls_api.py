"""The URLconf of the routes reached with an API key (``inference.urls.key_urlpatterns``), which the web server
serves through ``rigdash.apihandler.ApiHandler``; anything else under them is OpenAI's 404, in its shape."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.urls import include, path

from inference.urls import key_urlpatterns
from inference.views.openai import openai_error


def not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    return openai_error(404, f"Unknown request URL: {request.method} {request.path}.", code="unknown_url")


urlpatterns = [path("", include((key_urlpatterns, "inference")))]
handler404 = not_found
