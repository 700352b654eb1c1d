"""What every view shares: the JSON error shape, the JSON body reader, and the decorators that check who may call.

Errors are ``{"error": {"code", "message"}}``. Domain errors (inference/errors.py) map to statuses here: NotFound
404, QueueUnavailable 503 (what was sent is stored; only its start waits), any other InvalidInput 400 unless a view
says otherwise.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse

from inference.errors import InvalidInput, NotFound, QueueUnavailable
from rigdash import strictjson
from rigdash.access import is_staff

View = Callable[..., HttpResponse]
T = TypeVar("T")


def json_error(code: str, message: str, status: int) -> JsonResponse:
    return JsonResponse({"error": {"code": code, "message": message}}, status=status)


def json_body(request: HttpRequest) -> dict[str, Any]:
    """The request's JSON object (an empty body is ``{}``); InvalidInput when it is not one."""
    try:
        body = strictjson.loads(request.body or b"{}")
    except ValueError:
        raise InvalidInput(
            "bad_json", "The request body is not valid JSON (numbers must be finite, nesting shallow)."
        ) from None
    if not isinstance(body, dict):
        raise InvalidInput("bad_json", "The request body must be a JSON object.")
    return body


def or_404(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)``, with NotFound turned into Django's 404 page (for HTML views)."""
    try:
        return fn(*args, **kwargs)
    except NotFound as exc:
        raise Http404(exc.message) from None


def staff_required(view: View) -> View:
    """Logged-in staff only: anonymous people go to the login page, everyone else gets a 404."""

    @login_required
    @functools.wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not is_staff(request.user):
            raise Http404("No such page")
        return view(request, *args, **kwargs)

    return wrapped


def api_view(*, staff: bool = False, statuses: Mapping[str, int] | None = None) -> Callable[[View], View]:
    """A JSON API view: 401 for anonymous callers, 404 for non-staff where ``staff``, and the domain errors as JSON
    (``statuses``: an InvalidInput code's status where it is not 400)."""

    def decorate(view: View) -> View:
        @functools.wraps(view)
        def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            if not request.user.is_authenticated:
                return json_error("not_authenticated", "Log in first.", 401)
            if staff and not is_staff(request.user):
                return json_error("not_found", "Not found.", 404)
            try:
                return view(request, *args, **kwargs)
            except NotFound as exc:
                return json_error(exc.code, exc.message, 404)
            except InvalidInput as exc:
                return json_error(exc.code, exc.message, (statuses or {}).get(exc.code, 400))
            except QueueUnavailable as exc:
                return json_error(exc.code, exc.message, 503)

        return wrapped

    return decorate
