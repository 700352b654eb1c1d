from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.templatetags.static import static
from django.urls import include, path
from django.views.generic.base import RedirectView

from inference.urls import board_urlpatterns
from monitoring.views import healthz, prometheus_metrics
from monitoring.views_calculator import api_calculator

urlpatterns = [
    path("healthz", healthz, name="healthz"),
    # Browsers ask for /favicon.ico on pages that name no icon (Django's admin): RigDash's own.
    path("favicon.ico", RedirectView.as_view(url=static("rigdash/favicon.svg"), http_method_names=["get", "head"])),
    path("metrics", prometheus_metrics, name="metrics"),
    path("api/calculator", api_calculator, name="api_calculator"),
    path("monitoring/", include("monitoring.urls")),
    path("alerts/", include("alerts.urls")),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("", include("inference.urls")),
    path("", include(board_urlpatterns)),  # admin board, users, quotas, audit log; usage
]
