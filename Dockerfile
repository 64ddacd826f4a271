# token-guard image: the builder stage installs the package and its runtime dependencies into a virtual environment;
# the final stage is a clean slim Python with only that environment, run as an unprivileged user.
#
#   docker build -t token-guard .
#   docker run -p 8080:8080 -e TOKEN_GUARD_UPSTREAM_URL=http://vllm:8000 -v /models:/models:ro token-guard
#   docker run -p 9002:9002 ... --no-healthcheck token-guard extproc   # Envoy's external processor (gRPC)
#
# Configure it with TOKEN_GUARD_* variables, or mount a TOML file and point TOKEN_GUARD_CONFIG at it.

FROM python:3.11-slim AS builder

WORKDIR /src
COPY pyproject.toml README.md ./
COPY proxy ./proxy
# No test extras, and no simulator (simulator/ is not copied; `simulate` and `demo` say so): the final image gets the
# runtime dependencies only, with the extproc extra (grpcio, protobuf, xds-protos: about 40 MB) so that one image
# runs both `serve` and `extproc`.
RUN python -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-cache-dir --disable-pip-version-check ".[extproc]"


FROM python:3.11-slim

# HF_HOME points at /tmp so a read-only root filesystem works; nothing is ever downloaded (HF_HUB_OFFLINE).
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HF_HOME=/tmp/huggingface \
    HF_HUB_OFFLINE=1
# Listen on every interface, not only loopback, so the port can be published. (DL3064 flags names containing TOKEN as
# possible secrets; TOKEN_GUARD_* is this program's name, and the address is not a secret.)
# hadolint ignore=DL3064
ENV TOKEN_GUARD_SERVER_HOST=0.0.0.0

COPY --from=builder /opt/venv /opt/venv
# A numeric user, so Kubernetes' runAsNonRoot can verify it without reading /etc/passwd.
RUN useradd --system --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin token-guard
USER 10001:10001

EXPOSE 8080
# token-guard extproc's gRPC port (extproc.port); it answers gRPC's health service, not /health (--no-healthcheck).
EXPOSE 9002
# slim has no curl. /health answers 200 once the upstream's models are known and the upstream is healthy.
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ.get('TOKEN_GUARD_SERVER_PORT', '8080') + '/health', timeout=4)"]

ENTRYPOINT ["token-guard"]
CMD ["serve"]
