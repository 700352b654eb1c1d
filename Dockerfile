# RigDash web and worker image (docker-compose.yml runs both from it).
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 RIGDASH_VAR_DIR=/data
WORKDIR /app
COPY pyproject.toml ./
RUN pip install --no-cache-dir . && mkdir -p /data
COPY manage.py ./
COPY rigdash ./rigdash
COPY inference ./inference
COPY monitoring ./monitoring
COPY templates ./templates
COPY static ./static
RUN RIGDASH_SECRET_KEY=build python manage.py collectstatic --noinput -v 0
EXPOSE 8000
# rigdash/launcher.py web_command (tests/test_compose.py checks it)
CMD ["python", "-m", "rigdash.webserver", "--host", "0.0.0.0", "--port", "8000"]
