from __future__ import annotations

from django.urls import path

from monitoring import views
from monitoring.calculator import sweep_views
from monitoring.calculator import views as calculator_views

app_name = "monitoring"

urlpatterns = [
    path("", views.overview, name="overview"),
    path("calculator/", calculator_views.calculator_page, name="calculator"),
    path("sweeps/", sweep_views.sweeps_page, name="sweeps"),
    path("sweeps/<int:sweep_id>/", sweep_views.sweep_page, name="sweep"),
    path("rigs/<int:rig_id>/", views.rig_dashboard, name="rig_dashboard"),
    path("rigs/<int:rig_id>/profile/", views.rig_profile, name="rig_profile"),
    path("api/rigs/<int:rig_id>/series", views.api_rig_series, name="api_rig_series"),
    path("api/rigs/<int:rig_id>/latency", views.api_rig_latency, name="api_rig_latency"),
]
