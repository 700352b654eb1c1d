from __future__ import annotations

from django.urls import path

from inference import views, views_models

app_name = "inference"

urlpatterns = [
    path("", views.session_list, name="session_list"),
    path("sessions/new", views.session_create, name="session_create"),
    path("sessions/<int:session_id>/", views.session_detail, name="session_detail"),
    path("api/sessions/<int:session_id>/turns", views.api_session_turns, name="api_session_turns"),
    path("api/turns/<int:turn_id>", views.api_turn_detail, name="api_turn_detail"),
    path("api/turns/<int:turn_id>/cancel", views.api_turn_cancel, name="api_turn_cancel"),
    path("api/rigs/<int:rig_id>/models", views.api_rig_models, name="api_rig_models"),
    # Model management (staff only; 404 for everyone else): inference/views_models.py
    path("rigs/<int:rig_id>/models/", views_models.rig_models_page, name="rig_models"),
    path("api/rigs/<int:rig_id>/models/state", views_models.api_rig_models_state, name="api_rig_models_state"),
    path("api/rigs/<int:rig_id>/models/pull", views_models.api_rig_models_pull, name="api_rig_models_pull"),
    path("api/rigs/<int:rig_id>/models/delete", views_models.api_rig_models_delete, name="api_rig_models_delete"),
    path("api/rigs/<int:rig_id>/models/unload", views_models.api_rig_models_unload, name="api_rig_models_unload"),
]
