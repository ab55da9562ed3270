# syntax=docker/dockerfile:1
# The gateway image: `docker build -t llm-gateway .`
#
#   builder  python:3.11 (compilers present in case a dependency has no wheel): a venv at /opt/venv with
#            the project installed by the same pip commands as `make demo` (Makefile), minus `-e` —
#            the same pyproject.toml, so the same runtime dependency set as `make demo` and `make test`.
#            Then `policies/` compiled with mypyc into the installed package, as `make native` does
#            for the checkout, with the same tools (scripts/build_policies.py --installed; mypy
#            uninstalled after it).
#   runtime  python:3.11-slim, no compilers, no pip cache, the venv copied over, a non-root user.
#
# Configuration: the YAML at /etc/gateway/gateway.yaml (mount yours over it) plus environment
# overrides, GATEWAY_<SECTION>__<FIELD> (docs/configuration.md), e.g. GATEWAY_SERVER__WORKERS=4,
# REDIS_URL, GATEWAY_JWT_SECRET. The image runs the simulators too: `docker run IMAGE sim --engine vllm`.

# Both stages must run the same Python (the venv links to /usr/local/bin/python3.11 and pip chose
# wheels and markers for the builder's version): pin a patch release, e.g. 3.11.14, for
# reproducible builds.
ARG PYTHON_VERSION=3.11

FROM python:${PYTHON_VERSION} AS builder
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python3 -m venv /opt/venv
WORKDIR /src
# Dependency metadata first, so the dependency layer is rebuilt only when pyproject.toml changes.
COPY pyproject.toml README.md ./
COPY gateway ./gateway
COPY engines ./engines
COPY policies ./policies
RUN /opt/venv/bin/pip install -q --upgrade pip \
 && /opt/venv/bin/pip install -q '.' \
 && /opt/venv/bin/gateway --help >/dev/null
# mypy as pinned by pyproject.toml's [dev] extra (tests/deploy/test_dockerfile.py checks it),
# uninstalled in the same layer once the build is done: the runtime gets the compiled modules, not
# the compiler. The import check (-I: not /src's sources) fails the build when the compiled router is
# missing or not built from the installed sources.
COPY scripts/build_policies.py ./scripts/
RUN /opt/venv/bin/pip install -q 'mypy>=1.10' 'setuptools>=68' \
 && /opt/venv/bin/python scripts/build_policies.py --installed \
 && /opt/venv/bin/pip uninstall -q -y mypy mypy_extensions pathspec librt ast_serialize \
 && GATEWAY_POLICIES=native /opt/venv/bin/python -I -c \
    'assert __import__("policies.router").router.__file__.endswith(".so")'

FROM python:${PYTHON_VERSION}-slim AS runtime
LABEL org.opencontainers.image.title="llm-gateway" \
      org.opencontainers.image.description="One OpenAI-compatible front door for fleets of vLLM and SGLang servers" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/venv/bin:$PATH \
    GATEWAY_POLICIES=native \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    GATEWAY_SERVER__HOST=0.0.0.0 \
    GATEWAY_SERVER__PORT=8080 \
    GATEWAY_SERVER__WORKERS=2
# A fixed numeric uid/gid so Kubernetes `runAsNonRoot` can verify it without reading /etc/passwd.
RUN groupadd --system --gid 10001 gateway \
 && useradd --system --uid 10001 --gid gateway --no-create-home --home-dir /nonexistent \
            --shell /usr/sbin/nologin gateway
COPY --from=builder /opt/venv /opt/venv
COPY deploy/gateway.example.yaml /etc/gateway/gateway.yaml
USER 10001:10001
WORKDIR /tmp
EXPOSE 8080
# /healthz answers while the process is alive; readiness (/readyz) is the orchestrator's business.
# python is in the image anyway (no curl in -slim); the port follows GATEWAY_SERVER__PORT.
HEALTHCHECK --interval=10s --timeout=3s --start-period=15s --retries=3 \
  CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('GATEWAY_SERVER__PORT', '8080'), timeout=2)"]
# uvicorn on SIGTERM: stop accepting, drain in-flight streams for server.graceful_shutdown_s, cancel.
STOPSIGNAL SIGTERM
ENTRYPOINT ["gateway"]
CMD ["serve", "--config", "/etc/gateway/gateway.yaml"]
