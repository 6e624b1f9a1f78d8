# syntax=docker/dockerfile:1
# pocketmq from this checkout: mqnamesrv, mqbroker, mqadmin and the client, on
# python:3.11-slim, run as a non-root user. docker-compose.yml builds it for the
# local cluster; `docker build -t pocketmq .` builds it alone.
#
# The base is pinned by tag and by digest (the multi-platform index of
# python:3.11-slim), so a rebuild gets the same interpreter and libraries.
# Both stages use the same base; bump tag and digest together, in both FROM lines
# (docker buildx imagetools inspect python:3.11-slim).
# Stage 1: build pocketmq's wheel from the checkout (.dockerignore keeps tests,
# benches, docs, virtualenvs and stores out of the context).
FROM python:3.11-slim@sha256:9c900dea9e8fb7e16277c179b555cc72d29a352dbc33cff48ad5a0412fd5bfc7 AS build
WORKDIR /src
COPY . .
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

# Stage 2: the runtime image. The wheel's dependencies (uvloop, msgpack,
# pydantic, sortedcontainers) come as manylinux wheels: no compiler needed.
FROM python:3.11-slim@sha256:9c900dea9e8fb7e16277c179b555cc72d29a352dbc33cff48ad5a0412fd5bfc7
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
COPY --from=build /wheels /wheels
# Importing uvloop proves the event loop the daemons use is there.
RUN pip install --no-cache-dir /wheels/*.whl \
    && rm -rf /wheels \
    && python -c "import uvloop, pocketmq.broker.app, pocketmq.nameserver.app"

# A fixed uid so that named volumes keep one owner across rebuilds. The store and
# kvConfig directories exist (owned by the user) before a volume is mounted on
# them, so Docker initialises a new named volume with that ownership.
RUN groupadd --system --gid 10001 pocketmq \
    && useradd --system --uid 10001 --gid pocketmq --create-home --home-dir /home/pocketmq pocketmq \
    && mkdir -p /home/pocketmq/store /home/pocketmq/namesrv \
    && chown -R pocketmq:pocketmq /home/pocketmq
USER 10001:10001
WORKDIR /home/pocketmq

# 9876 the nameserver, 10911 the broker (docker-compose.yml runs broker-b on 10921).
EXPOSE 9876 10911
# No HEALTHCHECK here: one image runs two roles, and each compose service
# declares the check of its own role (docker-compose.yml).
CMD ["mqnamesrv"]
