# The reactor sidecar: `docker build -t backstop-reactor .`, then see compose.yaml.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_PYTHON_DOWNLOADS=never \
    UV_PROJECT_ENVIRONMENT=/app/.venv

# uv from PyPI, pinned to the version that wrote uv.lock.
RUN pip install --no-cache-dir uv==0.13.9

WORKDIR /app

# Dependencies first, in their own layer: a change to the code does not download them again.
# --no-dev alone would still install the bench group (pyproject's default-groups), hence
# --no-default-groups; --locked fails the build if uv.lock is out of date with pyproject.toml.
COPY pyproject.toml uv.lock README.md ./
RUN uv sync --locked --no-dev --no-default-groups --no-install-project
COPY reactor ./reactor
COPY triggers ./triggers
RUN uv sync --locked --no-dev --no-default-groups --no-editable

# Never root: the reactor needs no privilege in the container, only its database role.
RUN useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin reactor
USER 10001

# Inside a container, health and metrics must be reachable from outside it: the probes bind to
# every interface. The operator's page stays on the container's loopback, out of reach of
# every other pod: reach it with `kubectl port-forward POD 9188`, or give it an address of its
# own behind an authenticating proxy (REACTOR_DASHBOARD_ADDR and REACTOR_DASHBOARD_URL; see
# docs/security.md, "Addresses: what each serves").
ENV PATH="/app/.venv/bin:$PATH" \
    REACTOR_HTTP_ADDR=0.0.0.0:9187 \
    REACTOR_DASHBOARD_ADDR=127.0.0.1:9188 \
    REACTOR_LOG_FORMAT=json
EXPOSE 9187

# slim has no curl: the image's own Python asks /healthz; a 503 or no answer raises, exit 1.
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:9187/healthz', timeout=4)"]

# The reactor is PID 1 and handles SIGTERM itself: stop intake, drain, exit 0. Give it
# REACTOR_DRAIN_SECONDS (20) plus a margin: `docker stop -t 30`, or stop_grace_period in compose.
ENTRYPOINT ["reactor"]
CMD ["run"]
