"""HTTP routes: the chat and its JSON API (namespace ``inference``); the admin board, users, quotas, audit log and the
usage pages (namespace ``board``). Staff-only routes answer 404 to everyone else."""

from __future__ import annotations

from django.urls import path

from inference.views import (
    anthropic_messages,
    anthropic_models,
    board,
    chat,
    chats,
    keys,
    llamacpp_native,
    models,
    ollama_api,
    openai_chat,
    openai_completions,
    openai_embeddings,
    openai_responses,
    rerank,
    rigs,
    sweeps,
    usage,
)

app_name = "inference"

# The routes a client reaches with an API key, not a session: the OpenAI-compatible API (inference/views/openai.py),
# Anthropic's Messages API and Ollama's (docs/openai.md). The web server serves them without the session middleware
# (rigdash/apihandler.py), so no view here may read ``request.session`` or a session's user.
key_urlpatterns = [
    path("v1/models", anthropic_models.models_list, name="openai_models"),  # OpenAI's, or Anthropic's by header
    path("v1/chat/completions", openai_chat.chat_completions, name="openai_chat_completions"),
    path("v1/embeddings", openai_embeddings.embeddings, name="openai_embeddings"),
    path("v1/completions", openai_completions.completions, name="openai_completions"),
    path("v1/responses", openai_responses.responses, name="openai_responses"),
    path("v1/responses/input_tokens", openai_responses.input_tokens, name="openai_responses_input_tokens"),
    path("v1/messages", anthropic_messages.messages, name="anthropic_messages"),
    path("v1/rerank", rerank.rerank, name="rerank"),
    path("v1/reranking", rerank.rerank, name="reranking"),
    path("v1/messages/count_tokens", anthropic_messages.count_tokens, name="anthropic_count_tokens"),
    path("api/chat", ollama_api.chat, name="ollama_chat"),
    path("api/generate", ollama_api.generate, name="ollama_generate"),
    path("api/embed", ollama_api.embed, name="ollama_embed"),
    path("api/embeddings", ollama_api.embeddings, name="ollama_embeddings"),
    path("api/tags", ollama_api.tags, name="ollama_tags"),
    path("api/show", ollama_api.show, name="ollama_show"),
    path("api/ps", ollama_api.ps, name="ollama_ps"),
    path("api/version", ollama_api.version, name="ollama_version"),
    path("api/pull", ollama_api.pull, name="ollama_pull"),
    path("api/push", ollama_api.push, name="ollama_push"),
    path("api/create", ollama_api.create, name="ollama_create"),
    path("api/copy", ollama_api.copy, name="ollama_copy"),
    path("api/delete", ollama_api.delete, name="ollama_delete"),
    path("v1/models/<path:model_id>", anthropic_models.model_detail, name="openai_model"),
    # llama-server's names for the same routes without /v1/ (a client whose base URL is the server's root).
    path("models", anthropic_models.models_list, name="root_models"),
    path("chat/completions", openai_chat.chat_completions, name="root_chat_completions"),
    path("responses", openai_responses.responses, name="root_responses"),
    # llama-server's own API (inference/views/llamacpp_native.py), as llama.vim, llama.vscode and SillyTavern ask it.
    path("completion", llamacpp_native.completion, name="llamacpp_completion"),
    path("completions", llamacpp_native.completion, name="llamacpp_completions"),
    path("infill", llamacpp_native.infill, name="llamacpp_infill"),
    path("tokenize", llamacpp_native.tokenize, name="llamacpp_tokenize"),
    path("detokenize", llamacpp_native.detokenize, name="llamacpp_detokenize"),
    path("rerank", rerank.rerank, name="llamacpp_rerank"),
    path("reranking", rerank.rerank, name="llamacpp_reranking"),
]

urlpatterns = [
    path("", chats.session_list, name="session_list"),
    path("sessions/new", chat.session_create, name="session_create"),
    path("sessions/import", chats.session_import, name="session_import"),
    path("sessions/<int:session_id>/", chats.session_detail, name="session_detail"),
    # Chat management (inference/views/chats.py): settings, presets, rename, delete, export, versions, compare.
    path("sessions/<int:session_id>/settings", chats.session_settings, name="session_settings"),
    path("sessions/<int:session_id>/preset", chats.session_preset, name="session_preset"),
    path("sessions/<int:session_id>/rename", chats.session_rename, name="session_rename"),
    path("sessions/<int:session_id>/delete", chats.session_delete, name="session_delete"),
    path("sessions/<int:session_id>/export.<str:kind>", chats.session_export, name="session_export"),
    path("api/sessions/<int:session_id>/settings", chats.api_session_settings, name="api_session_settings"),
    path("api/sessions/import", chats.api_session_import, name="api_session_import"),
    path("api/turns/<int:turn_id>/branch", chats.api_turn_branch, name="api_turn_branch"),
    path("compare/", chats.compare_new, name="compare_new"),
    path("compare/<int:left_id>/<int:right_id>/", chats.compare, name="compare"),
    path("api/sessions/<int:session_id>/turns", chat.api_session_turns, name="api_session_turns"),
    path("api/turns/<int:turn_id>", chat.api_turn_detail, name="api_turn_detail"),
    path("api/turns/<int:turn_id>/cancel", chat.api_turn_cancel, name="api_turn_cancel"),
    path("api/rigs/<int:rig_id>/models", chat.api_rig_models, name="api_rig_models"),
    # The user's own API keys for the OpenAI-compatible API (staff see and revoke everyone's)
    path("keys/", keys.api_keys_page, name="api_keys"),
    path("keys/<int:key_id>/revoke", keys.api_key_revoke, name="api_key_revoke"),
    path("keys/<int:key_id>/storage", keys.api_key_storage, name="api_key_storage"),
    *key_urlpatterns,
    # Model management (staff only)
    path("rigs/<int:rig_id>/models/", models.rig_models_page, name="rig_models"),
    path("api/rigs/<int:rig_id>/models/state", models.api_rig_models_state, name="api_rig_models_state"),
    path("api/rigs/<int:rig_id>/models/pull", models.api_rig_models_pull, name="api_rig_models_pull"),
    path("api/rigs/<int:rig_id>/models/delete", models.api_rig_models_delete, name="api_rig_models_delete"),
    path("api/rigs/<int:rig_id>/models/load", models.api_rig_models_load, name="api_rig_models_load"),
    path("api/rigs/<int:rig_id>/models/unload", models.api_rig_models_unload, name="api_rig_models_unload"),
]

board_urlpatterns = (
    [
        path("board/", board.board_page, name="board"),
        path("board/api/turns", board.api_board_turns, name="api_turns"),
        path("board/api/turns/<int:turn_id>/cancel", board.api_board_cancel, name="api_cancel"),
        path("board/users/", board.users_page, name="users"),
        path("board/users/<int:user_id>/", board.user_action, name="user_action"),
        path("board/quotas/", board.quotas_page, name="quotas"),
        path("board/quotas/<int:quota_id>/", board.quotas_page, name="quota_edit"),
        path("board/quotas/<int:quota_id>/delete", board.quota_delete, name="quota_delete"),
        path("board/audit/", board.audit_page, name="audit"),
        path("board/rigs/", rigs.rigs_page, name="rigs"),
        path("board/rigs/new", rigs.rig_edit, name="rig_new"),
        path("board/rigs/<int:rig_id>/", rigs.rig_edit, name="rig_edit"),
        path("board/rigs/<int:rig_id>/delete", rigs.rig_delete, name="rig_delete"),
        path("board/rigs/<int:rig_id>/agent-key", rigs.rig_agent_key, name="rig_agent_key"),
        path("board/api/sweeps", sweeps.api_sweep_start, name="api_sweep_start"),
        path("board/api/sweeps/<int:sweep_id>/cancel", sweeps.api_sweep_cancel, name="api_sweep_cancel"),
        path("board/sweeps/<int:sweep_id>.csv", sweeps.sweep_csv, name="sweep_csv"),
        path("usage/", usage.usage_page, name="usage"),
        path("usage.csv", usage.usage_csv, name="usage_csv"),
    ],
    "board",
)
