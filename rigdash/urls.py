from __future__ import annotations

from django.contrib import admin
from django.templatetags.static import static
from django.urls import include, path
from django.views.generic.base import RedirectView

from inference.urls import board_urlpatterns
from monitoring.calculator.views import api_calculator
from monitoring.views import healthz, prometheus_metrics
from rigdash.sso import views as sso_views

urlpatterns = [
    path("healthz", healthz, name="healthz"),
    # Browsers ask for /favicon.ico on pages that name no icon (Django's admin): RigDash's own.
    path("favicon.ico", RedirectView.as_view(url=static("rigdash/favicon.svg"), http_method_names=["get", "head"])),
    path("metrics", prometheus_metrics, name="metrics"),
    path("api/calculator", api_calculator, name="api_calculator"),
    path("monitoring/", include("monitoring.urls")),
    path("alerts/", include("monitoring.alerts.urls")),
    path("login/", sso_views.LoginView.as_view(), name="login"),
    path("login/sso/", sso_views.SsoLoginView.as_view(), name="sso_login"),
    path("login/sso/callback/", sso_views.SsoCallbackView.as_view(), name="sso_callback"),
    path("logout/", sso_views.LogoutView.as_view(), name="logout"),
    path("admin/login/", sso_views.admin_login),  # RigDash's login page while local accounts are off
    path("admin/", admin.site.urls),
    path("", include("inference.urls")),
    path("", include(board_urlpatterns)),  # admin board, users, quotas, audit log; usage
]
