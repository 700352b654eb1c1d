"""Single sign-on: OpenID Connect login through mozilla-django-oidc, provider groups mapped to RigDash roles."""
