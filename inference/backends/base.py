"""The backend contract every inference server plug-in follows, and the errors it may raise.

A backend lists its models, reports its health and streams one chat completion. Closing the stream
(``aclose()`` on the iterator, or leaving the ``async for``) must stop the server decoding it.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple, TypeVar

ReadGate = Callable[[], Awaitable[None]]
OnSent = Callable[[], None]


class BackendError(Exception):
    """A backend failure with a message fit to show the user. ``retryable`` marks transient faults."""

    retryable = False
    code = "backend_error"


class BackendUnavailable(BackendError):
    """The server refused the connection, timed out or answered 5xx."""

    retryable = True
    code = "backend_unavailable"


class ModelLoading(BackendUnavailable):
    """The server is still loading the model, or its queue is full: the same request can succeed shortly."""

    code = "model_loading"


class BackendOutOfMemory(BackendError):
    """The server cannot hold the model (and its context) in the memory it has: trying again will not help."""

    code = "out_of_memory"


class ModelNotFound(BackendError):
    code = "unknown_model"


class ModelLoadFailed(BackendError):
    """The server tried to load the model and could not (a broken or unreadable file; a router's instance that
    exited): the same request fails the same way until someone fixes the rig."""

    code = "model_load_failed"


class ModelNotLoaded(BackendError):
    """The server has the model but does not load it for a request (a llama-server router started with
    ``--no-models-autoload`` answers 400 "model is not loaded": tools/server/server-models.cpp,
    ``router_validate_model``): the same request fails until someone loads the model."""

    code = "model_not_loaded"


class ContextOverflow(BackendError):
    """The prompt is longer than the context the model runs with: llama-server's ``exceed_context_size_error``
    (HTTP 400 with ``n_prompt_tokens`` and ``n_ctx``), Ollama's "the prompt is longer than the context length"
    (llm/llama_server.go, ``completionPromptForRequest``). Sending it again fails the same way."""

    code = "context_overflow"

    def __init__(self, server: str, *, prompt_tokens: int | None = None, context_tokens: int | None = None) -> None:
        self.prompt_tokens, self.context_tokens = prompt_tokens, context_tokens
        sizes = (
            f" ({prompt_tokens} tokens, in a context of {context_tokens})"
            if prompt_tokens and context_tokens
            else f" (a context of {context_tokens} tokens)"
            if context_tokens
            else ""
        )
        super().__init__(
            f"{server}: the prompt is longer than the model's context{sizes}. Start a new chat or a branch with less"
            " history, shorten the system prompt or message, or use a larger context (num_ctx on Ollama,"
            " llama-server's -c)."
        )


class ThinkingNotSupported(BackendError):
    """The request asked a model without reasoning to think (Ollama's 400 ``"x" does not support thinking``,
    server/routes.go ChatHandler)."""

    code = "thinking_not_supported"


class BackendNotSupported(BackendError):
    """The backend has no such capability (e.g. llama.cpp has no model pull)."""

    code = "not_supported"


class BackendRefused(BackendError):
    """The server refused the request as asked (a 4xx other than an unknown model: a field it does not take, a
    malformed tool, a prompt over its context). ``status`` and ``words`` are the server's own: an API client gets
    them back as they were said, since the request was its own."""

    code = "backend_refused"

    def __init__(self, server: str, status: int, words: str) -> None:
        super().__init__(f"{server} answered {status}: {words}")
        self.status = status
        self.words = words


def refusal_or(error: BackendError, server: str, status: int | None, words: str) -> BackendError:
    """``error`` (classed by its words), or a BackendRefused where nothing known was said and the status is 4xx
    (not 404: an unknown model) or 501 (a feature the server or its model does not have)."""
    if status is None or type(error) not in (BackendError, BackendUnavailable):
        return error
    if (400 <= status < 500 and status != 404) or status == 501:  # 501: not implemented
        return BackendRefused(server, status, words)
    return error


class BackendProtocolError(BackendError):
    """The server answered something this plug-in cannot parse."""

    code = "backend_protocol"


UNREADABLE_EVENT = "the backend sent an event RigDash cannot read"


class BackendBadEvent(BackendProtocolError):
    """A stream event in valid framing that is not what the server's protocol sends (not JSON, not an object,
    not UTF-8, a field of the wrong type): the reply cannot go on, and retrying would read the same."""

    code = "backend_bad_event"

    def __init__(self, detail: str = "") -> None:
        super().__init__(UNREADABLE_EVENT)
        self.detail = detail


PLAIN_REASONS = {
    "backend_unavailable": "the backend could not be reached or failed; try again in a moment",
    "backend_bad_event": UNREADABLE_EVENT,
    "backend_protocol": "the backend answered something RigDash cannot read",
    "unknown_model": "the backend does not have this model",
    "model_load_failed": "the backend could not load this model (its file may be broken); trying again will fail the"
    " same way until an admin fixes the rig",
    "not_supported": "the backend cannot do this",
    "model_not_loaded": "this model is not loaded, and the rig's server loads models only when asked (llama-server"
    " --no-models-autoload): an admin can load it on the rig's Models page, or pick a loaded model",
}


# Kinds whose message RigDash wrote for the user from the server's words about memory or loading (no URL, no path):
# shown whole, since what to do next depends on them (inference/backends/failures.py).
USER_FACING = frozenset(
    {"out_of_memory", "model_loading", "context_overflow", "thinking_not_supported", "backend_refused"}
)


def user_message(rig_name: str, exc: BackendError) -> str:
    """What an ordinary user is told: the rig's name and a plain reason. ``str(exc)`` (backend URLs, file paths,
    the server's own words) is for staff only, except the kinds in ``USER_FACING``."""
    if exc.code in USER_FACING:
        return f"Rig {rig_name}: {exc}"
    return f"Rig {rig_name}: {PLAIN_REASONS.get(exc.code, 'the backend refused the request')}."


# Where a model's ``context_length`` comes from (``ModelInfo.context_source``): the running server's own context for
# a request; the command line a llama-server router will start the model with; the model file's trained context.
CONTEXT_FROM_SERVER, CONTEXT_FROM_ROUTER_ARGS, CONTEXT_FROM_MODEL_FILE = "server", "router_args", "model_file"


@dataclass(frozen=True)
class ModelInfo:
    name: str
    context_length: int | None = None
    size_bytes: int | None = None
    details: dict[str, Any] = field(default_factory=dict)
    context_source: str | None = None  # CONTEXT_FROM_*; None where the backend does not say


@dataclass(frozen=True)
class Health:
    ok: bool
    detail: str
    version: str = ""


# Reasoning effort levels, as Ollama's ThinkValue (api/types.go, IsValid; "max" is read as "high") and the OpenAI
# ``reasoning_effort`` llama-server passes to the chat template take them.
THINK_LEVELS = ("low", "medium", "high")


@dataclass(frozen=True)
class ChatRequest:
    model: str
    # OpenAI's messages: text content, or content parts, an assistant's ``tool_calls``, a tool's ``tool_call_id``.
    messages: list[dict[str, Any]]
    max_tokens: int
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    top_k: int | None = None
    min_p: float | None = None
    repeat_penalty: float | None = None
    stop: tuple[str, ...] = ()  # strings that end the reply (the backend leaves them out of the text)
    # Server-side knobs a backend may honour and others ignore (llama.cpp fixes its context at start).
    num_ctx: int | None = None
    keep_alive: str | None = None
    # Ask a reasoning model to think first (True, or an effort level in THINK_LEVELS), to answer at once (False),
    # or leave it to the server (None). Ollama's ``think`` takes either (api/types.go ThinkValue); llama-server
    # takes the level as ``reasoning_effort``.
    think: bool | str | None = None
    # An API client's other fields (``tools``, ``response_format``, ``logprobs``, samplers RigDash has no name for),
    # passed to the server unchanged: an OpenAI-speaking backend merges them into its body under its own keys
    # (``stream``, ``timings_per_token``); another maps what it can and refuses the rest (BackendNotSupported).
    extra: Mapping[str, Any] = field(default_factory=dict)
    # A raw completion (OpenAI's ``/v1/completions``): the prompt as the client wrote it, no chat template; None for
    # a chat. ``messages`` then holds it as one user message, for estimates.
    prompt: str | None = None
    # A request in llama-server's own API (``Capabilities.native_completions``): "completion" or "infill", its body
    # ``extra`` as the client sent it (``prompt`` the completion's, as ``prompt`` says); None for any other request.
    native: str | None = None


class LayerKV(NamedTuple):
    """One layer's cache: ``kv_heads`` of ``key_dim`` + ``value_dim`` elements per token (0 heads: no attention,
    as in a recurrent layer), within the last ``window`` tokens only (0: every token, full attention), plus
    ``state_bytes`` per sequence whatever its length (a recurrent layer's state, f32)."""

    kv_heads: int
    key_dim: int
    value_dim: int
    window: int = 0
    state_bytes: int = 0


@dataclass(frozen=True)
class ModelArchitecture:
    """What KV-cache arithmetic needs to know about a model (GGUF ``<arch>.*`` keys). ``layers``: the cache per
    layer (inference/backends/kv_layers.py), when read from metadata; empty, every layer is the uniform
    ``head_count_kv`` x (key + value) of full attention."""

    arch: str
    block_count: int
    head_count: int
    head_count_kv: int
    embedding_length: int
    context_length: int | None = None
    key_length: int | None = None
    value_length: int | None = None
    layers: tuple[LayerKV, ...] = ()


@dataclass(frozen=True)
class LoadedModel:
    """A model the server holds in memory now, and how much of it sits in VRAM."""

    name: str
    size_bytes: int
    size_vram_bytes: int | None = None
    context_length: int | None = None
    expires_at: str | None = None
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PullProgress:
    """One step of a model download as the server reports it; ``status == "success"`` ends it."""

    status: str
    digest: str | None = None
    total: int | None = None
    completed: int | None = None

    @property
    def done(self) -> bool:
        return self.status == "success"


@dataclass
class BackendStats:
    """The backend's own account of a reply, normalised; ``raw`` keeps its fields as it sent them."""

    prompt_tokens: int | None = None
    prompt_ms: float | None = None
    cached_tokens: int | None = None
    output_tokens: int | None = None
    decode_ms: float | None = None
    decode_tps: float | None = None
    # Speculative decoding: tokens the draft model proposed for this reply and how many the model accepted.
    draft_tokens: int | None = None
    draft_accepted_tokens: int | None = None
    raw: dict[str, Any] = field(default_factory=dict)
    # ``prompt_tokens`` is what the server evaluated, ``cached_tokens`` what it took from its cache (llama-server's
    # prompt_n and cache_n). Ollama's prompt_eval_count counts both (llm/llama_server.go ``promptEvalCount``:
    # cache_n + prompt_n) and says nothing of the split: then ``prompt_counts_cached``. ``prompt_ms`` covers only
    # the evaluated part on both.
    prompt_counts_cached: bool = False
    load_ms: float | None = None  # loading the model before this reply (Ollama's load_duration)

    @property
    def prompt_total_tokens(self) -> int | None:
        """The whole prompt the model read, cached tokens included: what "prompt N tok" means on every backend."""
        if self.prompt_tokens is None:
            return None
        return self.prompt_tokens if self.prompt_counts_cached else self.prompt_tokens + (self.cached_tokens or 0)

    @property
    def prefill(self) -> tuple[float, bool] | None:
        """Prompt tokens evaluated per second, and whether it is only an upper bound (Ollama: its count includes
        cached tokens that took no time, so tokens / time is at least the true rate)."""
        if not self.prompt_tokens or not self.prompt_ms:
            return None
        return round(self.prompt_tokens / self.prompt_ms * 1000, 1), self.prompt_counts_cached

    @property
    def draft_acceptance(self) -> float | None:
        """Accepted over drafted tokens, or None when nothing was drafted."""
        if not self.draft_tokens or self.draft_accepted_tokens is None:
            return None
        return self.draft_accepted_tokens / self.draft_tokens


@dataclass
class StreamChunk:
    """Text decoded since the previous chunk (may hold several tokens, or none): the answer's ``text`` and the
    reasoning's ``thinking`` (a reasoning model's thoughts before its answer; either may be empty)."""

    text: str
    finish_reason: str | None = None
    stats: BackendStats | None = None
    context_tokens: int | None = None  # tokens in the sequence's context now, when the backend says
    thinking: str = ""
    # OpenAI's ``delta.tool_calls`` as the server streamed them (index, id, function name and argument pieces):
    # passed on to an API client unchanged, and merged into the turn's tool calls at its end.
    tool_calls: list[dict[str, Any]] | None = None
    # OpenAI's ``choices[0].logprobs`` of this chunk, when the request asked for them.
    logprobs: dict[str, Any] | None = None
    # The request's stop sequence that ended the reply, on the last chunk, where the backend says which.
    stop_word: str | None = None
    # On the last chunk of a request in llama-server's own API: the figures of its last event that the answer to
    # the client repeats (``truncated``, ``tokens_cached``, ``stop_type``...), as the server sent them.
    ending: dict[str, Any] | None = None

    @property
    def carries(self) -> bool:
        """Whether the chunk holds anything for the client (text, thoughts, tool calls or logprobs)."""
        return bool(self.text or self.thinking or self.tool_calls or self.logprobs)

    def storable(self) -> StreamChunk:
        """The chunk with each NUL character in its text, thoughts, tool calls and logprobs replaced
        (``without_nul``); itself when it holds no text or thoughts with one, and no tool calls or logprobs."""
        if self.tool_calls is None and self.logprobs is None and NUL not in self.text and NUL not in self.thinking:
            return self
        return dataclasses.replace(
            self, text=without_nul(self.text), thinking=without_nul(self.thinking),
            tool_calls=without_nul(self.tool_calls), logprobs=without_nul(self.logprobs),
        )  # fmt: skip


NUL = "\x00"
T = TypeVar("T")


def without_nul(value: T) -> T:
    """``value`` with each NUL character (U+0000) replaced by U+FFFD, in the strings nested in its lists and dicts too.
    Model output may hold one (a byte token 0 decoded), and PostgreSQL stores none in a text or jsonb column: the
    turn's text could not be stored, and it would stay running."""
    if isinstance(value, str):
        return value.replace(NUL, "\ufffd") if NUL in value else value  # type: ignore[return-value]
    if isinstance(value, list):
        return [without_nul(item) for item in value]  # type: ignore[return-value]
    if isinstance(value, dict):
        return {without_nul(k): without_nul(v) for k, v in value.items()}  # type: ignore[return-value]
    return value


@dataclass(frozen=True)
class Capabilities:
    """What code outside a backend asks of it, instead of testing its kind (docs/architecture.md, "Backends").

    Optional operations (pull, delete, unload, count a prompt, ...) are methods of ``Backend``; whether a backend has
    one is ``backend_supports(kind, method)``. These are the facts about the server that shape requests and figures."""

    # Chat settings the server takes per request beyond the common samplers (Ollama's ``num_ctx``): the chat's
    # settings form shows them, and a chat on another kind of rig refuses them.
    request_settings: frozenset[str] = frozenset()
    # A request chooses the context window it runs in (Ollama loads the model with ``num_ctx``); otherwise it is
    # fixed when the server starts (llama-server's ``-c``) and a request cannot change it.
    context_per_request: bool = False
    # Each model has a window of its own, so a cached window is per model; otherwise one window serves every request.
    context_per_model: bool = False
    # An over-long prompt is cut to the window, oldest messages first (Ollama's chatPrompt), rather than refused.
    truncates_to_window: bool = False
    # Reasoning can be switched per request (``think``); the thoughts stream apart from the answer.
    reasoning_switch: bool = True
    # A request can ask for an effort level (THINK_LEVELS), for the models whose template reads one (Ollama's
    # ``think: "low"``; llama-server's ``reasoning_effort``); ``Backend.model_capabilities`` says which models.
    reasoning_levels: bool = False
    # The server loads a model when a request names one it does not hold (Ollama): a turn for an unloaded model waits
    # for the load before its first token (``loaded_models`` says which are loaded).
    loads_on_demand: bool = False
    # The server's own completion API (llama-server's ``/completion`` and ``/infill``): a request in its fields is
    # sent there as the client wrote it (``ChatRequest.native``); another kind refuses one.
    native_completions: bool = False


class Backend(ABC):
    kind: str
    # A human name for the kind, as the rig pages show it.
    label: ClassVar[str] = ""
    capabilities: ClassVar[Capabilities] = Capabilities()
    # ``needs_load`` gets no answer in time while the server loads a model (Ollama's /api/ps waits on a loading
    # runner): silence then means a load, not a stuck server.
    silent_while_loading: ClassVar[bool] = False
    # Whether ``stream_chat`` awaits ``read_gate`` after every read that brought text. The worker publishes its
    # batches there (inference/worker/stream.py); a plug-in that cannot (its client reads the stream itself) is read
    # on a task of its own, and the worker calls the gate after whatever that task read together.
    calls_read_gate: ClassVar[bool] = False

    def __init__(self, base_url: str, *, timeout_s: float = 10.0, api_key: str = "") -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        # The rig's backend key (llama-server --api-key, a bearer a proxy in front of Ollama or vLLM checks), sent
        # on every request to the server: docs/deploy.md, "A key for the backend".
        self.headers = auth_headers(api_key)

    @abstractmethod
    async def health(self) -> Health: ...

    @abstractmethod
    async def list_models(self) -> list[ModelInfo]: ...

    @abstractmethod
    def stream_chat(
        self, request: ChatRequest, *, read_gate: ReadGate | None = None, on_sent: OnSent | None = None
    ) -> AsyncIterator[StreamChunk]:
        """Stream one reply. The last chunk carries ``finish_reason`` and the backend's final ``stats``; earlier
        chunks may carry running stats (llama.cpp sends its timings with every token).

        ``read_gate``: after a read from the server that brought text, a plug-in that reads the socket itself
        awaits it before reading again, reading nothing meanwhile (and sets ``calls_read_gate``). The caller
        publishes what was read, and returns when it could publish the next batch, so tokens wait in the kernel's
        buffer instead of waking the process one by one.

        ``on_sent``: called once the request is written to the server, before the wait for its answer (which may
        last the whole prompt). A plug-in that cannot see its client's write calls it as the request starts."""

    # Optional capabilities: a backend that cannot answer raises BackendNotSupported.
    async def model_architecture(self, model: str) -> ModelArchitecture:
        raise BackendNotSupported(f"{self.kind} cannot describe a model's architecture")

    async def context_window(self, model: str) -> int | None:
        """Tokens of context one sequence of ``model`` gets on this server (a llama.cpp slot's n_ctx)."""
        return None

    async def prompt_tokens(self, model: str, messages: list[dict[str, str]]) -> int:
        """Tokens ``messages`` make as ``model``'s prompt: its chat template applied, then its tokenizer."""
        raise BackendNotSupported(f"{self.kind} cannot count a prompt's tokens")

    async def input_tokens(self, body: dict[str, Any]) -> int:
        """Tokens an OpenAI chat request's prompt makes (``body``: its ``model``, ``messages``, ``tools``, template
        options), as the server would read it with nothing cached, without running it."""
        raise BackendNotSupported(f"{self.kind} cannot count a request's tokens")

    async def tokenize(self, body: dict[str, Any]) -> dict[str, Any]:
        """llama-server's ``/tokenize`` answer to ``body`` (``content``, ``add_special``, ``with_pieces``...; its
        ``model`` the server's name for it): text as the model's token ids."""
        raise BackendNotSupported(f"{self.kind} cannot tokenize text")

    async def detokenize(self, body: dict[str, Any]) -> dict[str, Any]:
        """llama-server's ``/detokenize`` answer to ``body`` (``tokens``; its ``model``): token ids as text."""
        raise BackendNotSupported(f"{self.kind} cannot detokenize tokens")

    async def embeddings(self, body: dict[str, Any]) -> dict[str, Any]:
        """OpenAI's ``/v1/embeddings`` answer to ``body`` (its ``model`` the server's name for it); BackendRefused
        where the server does not serve embeddings, with its status and words."""
        raise BackendNotSupported(f"{self.kind} cannot make embeddings")

    async def rerank(self, body: dict[str, Any]) -> dict[str, Any] | list[Any]:
        """The server's answer to a rerank request (``body``: Jina's ``query``, ``documents``, ``top_n``, or TEI's
        ``texts``; its ``model`` the server's name): Jina's object with ``results``, or TEI's list. BackendRefused
        where the server does not rerank, with its status and words."""
        raise BackendNotSupported(f"{self.kind} cannot rerank documents")

    async def loaded_models(self) -> list[LoadedModel]:
        raise BackendNotSupported(f"{self.kind} cannot list loaded models")

    async def model_capabilities(self, model: str) -> frozenset[str]:
        """What ``model`` can do as the server says (Ollama's /api/show ``capabilities``: "completion",
        "thinking", "tools", ...; "think_levels" where it takes an effort level). Unknown: empty."""
        return frozenset()

    def pull_model(self, model: str) -> AsyncIterator[PullProgress]:
        """Download a model, yielding progress; the last item has ``done``. Closing it stops watching."""
        raise BackendNotSupported(f"{self.kind} cannot pull models")

    async def delete_model(self, model: str) -> None:
        raise BackendNotSupported(f"{self.kind} cannot delete models")

    async def needs_load(self, model: str) -> bool:
        """Whether the server must load ``model`` before it can read a prompt for it (a server that loads on demand,
        ``Capabilities.loads_on_demand``): by default, whether its loaded models leave it out."""
        return not any(same_model(entry.name, model) for entry in await self.loaded_models())

    async def load_model(self, model: str) -> None:
        """Load a model the server has but does not hold in memory (llama-server's router mode), returning once it
        is loaded."""
        raise BackendNotSupported(f"{self.kind} cannot load models on demand")

    async def unload_model(self, model: str) -> None:
        """Free the memory a loaded model holds now (the files stay)."""
        raise BackendNotSupported(f"{self.kind} cannot unload models")


def auth_headers(api_key: str) -> dict[str, str]:
    """The header that carries a rig's backend key: a bearer token, as llama-server's --api-key, vLLM's --api-key and
    the proxies people put in front of Ollama check it."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def same_model(a: str, b: str) -> bool:
    """Ollama's names: ``smollm2`` is ``smollm2:latest``."""

    def full(name: str) -> str:
        return name if ":" in name.rsplit("/", 1)[-1] else f"{name}:latest"

    return full(a) == full(b)


def positive_int(value: Any) -> int | None:
    """A count a server's JSON gives (slots, a context, a size): the value if it is a positive integer, else None (a
    bool, a float, a string or a zero is no count)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
