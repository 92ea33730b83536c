# dekube node image. Targets:
#   node     (default) validator / relay / client node, no torch
#   compute  the node plus the [compute] extra: torch==2.13.0 (CPU wheel by default)
#   router   a NAT router for the compose testnet (nftables masquerade, no inbound)
# Build args:
#   BASE         base image with Python 3.11 (default python:3.11-slim; deploy/build-base.sh makes
#                one from the Debian mirror alone where no image registry is reachable)
#   TORCH_INDEX  pip index for torch (default the CPU wheels). A CUDA compute image:
#                  docker build --target compute -t dekube-compute:cuda \
#                    --build-arg BASE=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04 \
#                    --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128 .
#                and run it with --gpus all ([train] device cuda in the task). A base without Python
#                (Debian/Ubuntu) gets python3 and python3-venv from apt.
# Wheels in deploy/wheels/ (git-ignored; deploy/build-images.sh fills it) are used before any index.
ARG BASE=python:3.11-slim

# deps: a venv with the package's dependencies only (the package directories are not copied yet,
# so a source change leaves this layer, torch included, in the cache)
FROM ${BASE} AS deps
# PIP_ARGS: extra pip options, e.g. --no-index to install from deploy/wheels alone
ARG PIP_ARGS=""
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
RUN python3 -m venv --help >/dev/null 2>&1 || { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install \
        -y --no-install-recommends python3 python3-venv && rm -rf /var/lib/apt/lists/*; }
COPY deploy/wheels/ /wheels/
RUN python3 -m venv /opt/dekube \
    && /opt/dekube/bin/pip install $PIP_ARGS --find-links /wheels --upgrade "pip>=23" "setuptools>=68" wheel
COPY pyproject.toml README.md LICENSE /src/
RUN /opt/dekube/bin/pip install $PIP_ARGS --find-links /wheels --no-build-isolation /src \
    && /opt/dekube/bin/pip uninstall -y dekube

FROM deps AS deps-compute
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ARG PIP_ARGS=""
RUN /opt/dekube/bin/pip install $PIP_ARGS --find-links /wheels ${TORCH_INDEX:+--extra-index-url "$TORCH_INDEX"} \
        --no-build-isolation "/src[compute]" \
    && /opt/dekube/bin/pip uninstall -y dekube

FROM ${BASE} AS runtime
RUN missing=""; command -v ip >/dev/null || missing="iproute2"; command -v python3 >/dev/null || missing="$missing python3"; \
    [ -z "$missing" ] || { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        $missing && rm -rf /var/lib/apt/lists/*; } \
    && useradd --system --uid 10001 --user-group --create-home --home-dir /home/dekube dekube \
    && mkdir -p /home/dekube/.dekube && chown dekube:dekube /home/dekube/.dekube && chmod 700 /home/dekube/.dekube
COPY deploy/nat-client.sh /usr/local/bin/dekube-nat-client
ENV PATH=/opt/dekube/bin:$PATH DEKUBE_HOME=/home/dekube/.dekube PYTHONUNBUFFERED=1 HOME=/home/dekube
WORKDIR /home/dekube
VOLUME /home/dekube/.dekube
EXPOSE 4001 8645
# /health of the node's HTTP server (DEKUBE_RPC_PORT if set, else 8645)
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 CMD python3 -c "import os, urllib.request; \
urllib.request.urlopen('http://127.0.0.1:%s/health' % os.environ.get('DEKUBE_RPC_PORT', '8645'), timeout=4)"
ENTRYPOINT ["dekube-node"]
CMD ["start"]

FROM runtime AS compute
COPY --from=deps-compute /opt/dekube /opt/dekube
COPY pyproject.toml README.md LICENSE /src/
COPY node /src/node
COPY consensus /src/consensus
COPY relay /src/relay
COPY ml /src/ml
COPY cli /src/cli
COPY devtools /src/devtools
RUN pip install --no-deps --no-build-isolation --no-index /src && rm -rf /src
USER dekube

FROM ${BASE} AS router
RUN { command -v nft && command -v ip; } >/dev/null || { apt-get update && apt-get install -y \
        --no-install-recommends nftables iproute2 && rm -rf /var/lib/apt/lists/*; }
COPY deploy/nat-router.sh /usr/local/bin/nat-router
ENTRYPOINT ["/usr/local/bin/nat-router"]

FROM runtime AS node
COPY --from=deps /opt/dekube /opt/dekube
COPY pyproject.toml README.md LICENSE /src/
COPY node /src/node
COPY consensus /src/consensus
COPY relay /src/relay
COPY ml /src/ml
COPY cli /src/cli
COPY devtools /src/devtools
RUN pip install --no-deps --no-build-isolation --no-index /src && rm -rf /src
USER dekube
