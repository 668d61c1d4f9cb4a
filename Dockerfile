# ricochet: one image for every command (worker by default; `monitor`, `replay`, `status`, ...).
# The base is a build argument for registry mirrors and machines that build their own (a Debian
# bookworm Python 3.11+ with venv, `python` and the CA certificates pip needs):
# `docker compose build --build-arg PYTHON_IMAGE=...`, or PYTHON_IMAGE in compose's environment.
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm
FROM ${PYTHON_IMAGE}

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/ricochet/bin:$PATH

# The same script the tests run, so the image installs exactly what was tested: the pinned,
# hash-checked dependencies of requirements.lock, then ricochet itself without resolving anything.
COPY requirements.lock pyproject.toml README.md /src/
COPY scripts/install-locked.sh /src/scripts/
COPY app/ /src/app/
RUN /src/scripts/install-locked.sh /opt/ricochet && rm -rf /src

# A numeric user, so Kubernetes' runAsNonRoot can verify it without reading /etc/passwd.
RUN groupadd --system --gid 10001 ricochet \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin ricochet
USER 10001:10001

# In a container the endpoints must be reachable from outside it (Prometheus, the orchestrator);
# outside one ricochet listens on loopback only.
ENV RICOCHET_HTTP_HOST=0.0.0.0
EXPOSE 8000
# Healthy means consuming (/readyz on RICOCHET_HTTP_PORT; slim has no curl): what compose's
# service_healthy and Swarm's rolling updates wait for before moving on. Docker itself restarts
# no unhealthy container, so a broker outage only shows as unhealthy. The start period covers
# RICOCHET_CONNECT_TIMEOUT_S's default. With the port set to 0 there is nothing to probe: turn
# the check off too (`healthcheck: disable: true` in compose).
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/readyz' % os.environ.get('RICOCHET_HTTP_PORT', '8000'), timeout=4)"]

# SIGTERM starts the drain: in-flight jobs get RICOCHET_SHUTDOWN_TIMEOUT_S to finish. The
# orchestrator's grace period (compose stop_grace_period, Kubernetes
# terminationGracePeriodSeconds) must be longer, or jobs are killed mid-way and run again.
STOPSIGNAL SIGTERM
# One worker process (the worker itself); RICOCHET_PROCESSES=auto runs a parent of one process per
# CPU of the container's quota, for handlers that burn CPU.
ENV RICOCHET_PROCESSES=1
ENTRYPOINT ["ricochet"]
CMD ["worker"]
