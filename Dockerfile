# The reactor sidecar: `docker build -t backstop-reactor .`; docs/deploying.md says how to run it.
#
# Two stages on one base: the builder holds uv and builds the venv; the runtime holds the venv
# and nothing else. The venv's interpreter is a link to the base's own python3, whose path
# differs between bases (/usr/local/bin in python:3.11-slim, /usr/bin in Debian's), hence one
# BASE for both stages. tests/container builds it on a stand-in base made from Debian's packages.
ARG BASE=python:3.11-slim

FROM ${BASE} AS builder

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_PYTHON_DOWNLOADS=never \
    UV_PROJECT_ENVIRONMENT=/app/.venv

# uv from PyPI, pinned to the version that wrote uv.lock; it stays in this stage.
RUN python3 -m pip install --no-cache-dir uv==0.13.9

WORKDIR /src

# Dependencies first, in their own layer: a change to the code does not download them again.
# --no-dev alone would still install the bench group (pyproject's default-groups), hence
# --no-default-groups; no extra: the terminal's tables (the cli extra), the demo's PostgreSQL
# and tracing are not what a sidecar runs. --locked fails the build if uv.lock is out of date
# with pyproject.toml.
COPY pyproject.toml uv.lock README.md ./
RUN uv sync --locked --no-dev --no-default-groups --no-install-project
# The project itself as a wheel, not a link to /src: the image runs the code the wheel carries.
COPY reactor ./reactor
COPY triggers ./triggers
RUN uv sync --locked --no-dev --no-default-groups --no-editable

FROM ${BASE}

ARG VERSION=0.1.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="backstop-reactor" \
      org.opencontainers.image.description="A PostgreSQL sidecar that records every finished job's run exactly once, right after its grace window." \
      org.opencontainers.image.licenses="MIT" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}"

# Never root: the reactor needs no privilege in the container, only its database role.
RUN useradd --system --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin reactor

COPY --from=builder /app/.venv /app/.venv

# Inside a container, health and metrics must be reachable from outside it: the probes bind to
# every interface. The operator's page stays on the container's loopback, out of reach of
# every other pod: reach it with `kubectl port-forward POD 9188`, or give it an address of its
# own behind an authenticating proxy (REACTOR_DASHBOARD_ADDR and REACTOR_DASHBOARD_URL; see
# docs/security.md, "Addresses: what each serves"). The bytecode was compiled in the builder:
# nothing is written at run time, so a read-only root filesystem works with no tmpfs.
ENV PATH="/app/.venv/bin:$PATH" \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    REACTOR_HTTP_ADDR=0.0.0.0:9187 \
    REACTOR_DASHBOARD_ADDR=127.0.0.1:9188 \
    REACTOR_LOG_FORMAT=json
EXPOSE 9187

USER 10001:10001
WORKDIR /app

# slim has no curl: the image's own Python asks /healthz on the port of REACTOR_HTTP_ADDR
# (0.0.0.0 is asked on loopback); a 503 or no answer raises, exit 1.
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; host, _, port = os.environ['REACTOR_HTTP_ADDR'].rpartition(':'); host = '127.0.0.1' if host in ('', '0.0.0.0') else host; urllib.request.urlopen(f'http://{host}:{port}/healthz', timeout=4)"]

# The reactor is PID 1 and handles SIGTERM itself: stop intake, drain, exit 0. Give it
# REACTOR_DRAIN_SECONDS (20) plus a margin: `docker stop -t 30`, or stop_grace_period in compose.
ENTRYPOINT ["reactor"]
CMD ["run"]
