"""Single sign-on settings from the environment (``settings.RIGDASH_OIDC``); no Django imports beyond the env
readers, so settings.py can build it."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from django.core.exceptions import ImproperlyConfigured

from rigdash.env import env_bool, env_float, env_list, env_secret, env_str

DISCOVERY_PATH = "/.well-known/openid-configuration"


@dataclass(frozen=True)
class OidcConfig:
    """An OpenID Connect provider RigDash signs users in with; ``enabled`` is False when none is set."""

    discovery_url: str = ""
    client_id: str = ""
    client_secret: str = ""
    public_url: str = ""  # RigDash's own address as browsers reach it; the redirect URI is built from it
    provider_name: str = "single sign-on"
    scopes: str = "openid email profile groups"
    groups_claim: str = "groups"
    username_claim: str = "preferred_username"
    user_groups: frozenset[str] = frozenset()  # empty: anyone the provider signs in is a user
    staff_groups: frozenset[str] = frozenset()
    superuser_groups: frozenset[str] = frozenset()
    superuser_subjects: frozenset[str] = frozenset()
    sign_algo: str = "RS256"
    timeout_s: float = 10.0
    local_login: bool = True  # local accounts' username and password form

    @property
    def enabled(self) -> bool:
        return bool(self.discovery_url)

    @property
    def provider_origin(self) -> str:
        """scheme://host[:port] of the provider, for the pages' form-action (the logout redirects there)."""
        parts = urlsplit(self.discovery_url)
        return f"{parts.scheme}://{parts.netloc}" if self.enabled else ""


def discovery_url_of(issuer_or_url: str) -> str:
    """The discovery document's URL from an issuer (``https://id.example/realms/x``) or that URL itself."""
    url = issuer_or_url.strip().rstrip("/")
    if not url or url.endswith(DISCOVERY_PATH):
        return url
    return url + DISCOVERY_PATH


def oidc_config_from_env() -> OidcConfig:
    """RIGDASH_OIDC_* and RIGDASH_LOCAL_LOGIN; fails loudly on a half-set provider or nobody able to log in."""
    local_login = env_bool("RIGDASH_LOCAL_LOGIN", True)
    discovery = discovery_url_of(env_str("RIGDASH_OIDC_ISSUER", ""))
    if not discovery:
        if not local_login:
            raise ImproperlyConfigured("RIGDASH_LOCAL_LOGIN=0 needs RIGDASH_OIDC_ISSUER: nobody could log in")
        return OidcConfig()
    config = OidcConfig(
        discovery_url=discovery,
        client_id=env_str("RIGDASH_OIDC_CLIENT_ID", ""),
        client_secret=env_secret("RIGDASH_OIDC_CLIENT_SECRET"),
        public_url=env_str("RIGDASH_PUBLIC_URL", "").rstrip("/"),
        provider_name=env_str("RIGDASH_OIDC_PROVIDER_NAME", "") or OidcConfig.provider_name,
        scopes=" ".join(env_str("RIGDASH_OIDC_SCOPES", OidcConfig.scopes).replace(",", " ").split()),
        groups_claim=env_str("RIGDASH_OIDC_GROUPS_CLAIM", OidcConfig.groups_claim),
        username_claim=env_str("RIGDASH_OIDC_USERNAME_CLAIM", OidcConfig.username_claim),
        user_groups=frozenset(env_list("RIGDASH_OIDC_USER_GROUPS", [])),
        staff_groups=frozenset(env_list("RIGDASH_OIDC_STAFF_GROUPS", [])),
        superuser_groups=frozenset(env_list("RIGDASH_OIDC_SUPERUSER_GROUPS", [])),
        superuser_subjects=frozenset(env_list("RIGDASH_OIDC_SUPERUSER_SUBJECTS", [])),
        sign_algo=env_str("RIGDASH_OIDC_SIGN_ALGO", OidcConfig.sign_algo),
        timeout_s=env_float("RIGDASH_OIDC_TIMEOUT_S", OidcConfig.timeout_s, minimum=0.5),
        local_login=local_login,
    )
    missing = [name for name, value in _required(config) if not value]
    if missing:
        raise ImproperlyConfigured(f"RIGDASH_OIDC_ISSUER is set, so set {', '.join(missing)} too")
    if "openid" not in config.scopes.split():
        raise ImproperlyConfigured("RIGDASH_OIDC_SCOPES must include openid")
    if urlsplit(config.public_url).scheme not in {"http", "https"}:
        raise ImproperlyConfigured(f"RIGDASH_PUBLIC_URL must be an http(s) URL, got {config.public_url!r}")
    return config


def _required(config: OidcConfig) -> list[tuple[str, str]]:
    return [
        ("RIGDASH_OIDC_CLIENT_ID", config.client_id),
        ("RIGDASH_OIDC_CLIENT_SECRET", config.client_secret),
        ("RIGDASH_PUBLIC_URL", config.public_url),
    ]


def authentication_backends(config: OidcConfig) -> list[str]:
    """axes first (it refuses a locked-out account or address), passwords while local accounts are on, the provider.

    Without ModelBackend in the list a local account's session no longer logs anyone in (Django's get_user)."""
    local = ["django.contrib.auth.backends.ModelBackend"] if config.local_login else []
    return ["axes.backends.AxesStandaloneBackend", *local, "rigdash.sso.backend.OidcBackend"]
