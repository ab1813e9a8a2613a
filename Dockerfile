# The GPU Runbook Bot: `runbook serve` with the Slurm clients (+ munge), etcdctl and the
# MariaDB client the shipped runbooks use, as a non-root user.
#
# Build it with `make image` (deploy/image/build): that makes the base image locally from
# Debian's packages when no registry is reachable, builds the bot's wheels on the host and
# passes them in the build context (wheels/), so pip needs no network here. Only the
# Debian packages below come from the network (the Debian mirror, during `apt-get`).
#
# Build arguments (docs/deployment.md#the-container-image):
#   BASE           a Debian-based image with python3 and its venv module
#                  (python:3.11-slim, or localhost/python:3.11-slim made by deploy/image/build)
#   SLURM_VERSION  pin the Slurm client packages to this Debian version (e.g. 22.05.8-4+deb12u3);
#                  empty: whatever the base's Debian release carries
#   EXTRA_APT_SOURCE  a one-line "deb [signed-by=/usr/share/keyrings/K.gpg] URL SUITE COMP"
#                  entry (or a deb822 stanza) added before installing: a site's own Slurm
#                  packages; its key goes into the context's debs/ folder as K.gpg
#   BOT_EXTRAS     the bot's optional dependencies to install (postgres: psycopg for HA)
#   BOT_UID        the numeric user the bot runs as
#   APT_OPTIONS    extra apt-get options (-o Acquire::...) the build host's mirror needs
# Local .deb files in the context's debs/ folder (e.g. a site's own slurm-client build) are
# installed instead of Debian's packages of the same names.

ARG BASE=python:3.11-slim
FROM ${BASE}

ARG SLURM_VERSION=
ARG EXTRA_APT_SOURCE=
ARG BOT_EXTRAS=postgres
ARG BOT_UID=10001
ARG DEBIAN_PACKAGES="ca-certificates munge slurm-client etcd-client mariadb-client"
# apt-get options the build host's mirror needs (deploy/image/build passes the host's own)
ARG APT_OPTIONS=

ENV DEBIAN_FRONTEND=noninteractive \
    LANG=C.UTF-8 \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    VIRTUAL_ENV=/opt/gpu-runbook-bot \
    PATH=/opt/gpu-runbook-bot/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    XDG_STATE_HOME=/var/lib \
    RUNBOOK_HEALTH_URL=http://127.0.0.1:8080/healthz

COPY debs/ /tmp/debs/
# Debian packages. policy-rc.d keeps postinst scripts from starting munged; the key munge's
# postinst generates is removed: every site mounts its own (an image-wide key would let
# anyone with the image forge credentials).
RUN set -eux; \
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod 0755 /usr/sbin/policy-rc.d; \
    if [ -n "$EXTRA_APT_SOURCE" ]; then \
        case "$EXTRA_APT_SOURCE" in \
            deb\ *) printf '%s\n' "$EXTRA_APT_SOURCE" > /etc/apt/sources.list.d/site.list ;; \
            *) printf '%s\n' "$EXTRA_APT_SOURCE" > /etc/apt/sources.list.d/site.sources ;; \
        esac; \
    fi; \
    if ls /tmp/debs/*.gpg >/dev/null 2>&1; then cp /tmp/debs/*.gpg /usr/share/keyrings/; fi; \
    packages="$DEBIAN_PACKAGES"; \
    if [ -n "$SLURM_VERSION" ]; then \
        packages="$(echo "$packages" | sed "s/slurm-client/slurm-client=$SLURM_VERSION slurm-wlm-basic-plugins=$SLURM_VERSION/")"; \
    fi; \
    local_debs="$(ls /tmp/debs/*.deb 2>/dev/null || true)"; \
    apt-get $APT_OPTIONS update; \
    apt-get $APT_OPTIONS install -y --no-install-recommends $packages $local_debs; \
    apt-get clean; \
    rm -rf /var/lib/apt/lists/* /tmp/debs /etc/munge/munge.key; \
    dpkg-query -W -f='${Package} ${Version}\n' | grep -E '^(slurm|munge|etcd-client|mariadb-client)' || true; \
    for tool in sinfo scontrol srun sacct munge munged etcdctl mariadb mariadb-dump; do command -v "$tool"; done

# The bot, from the wheels built on the host (no index: the build needs no PyPI): first its
# dependencies (wheels/: every wheel the bot and its extras need; a layer the cache keeps
# while they stay the same), then the bot itself (wheels-bot/).
COPY wheels/ /tmp/wheels/
RUN set -eux; \
    python3 -m venv "$VIRTUAL_ENV"; \
    "$VIRTUAL_ENV/bin/pip" install --no-cache-dir --no-index --no-deps /tmp/wheels/*.whl; \
    rm -rf /tmp/wheels
COPY wheels-bot/ /tmp/wheels-bot/
# The shipped runbooks also at a fixed path (the wheel has them too, as bot/_runbooks): the
# Kubernetes configuration names this path beside the site's own runbooks.
COPY runbooks/ /usr/share/gpu-runbook-bot/runbooks/
COPY deploy/image/run-munged /usr/local/bin/run-munged
RUN set -eux; \
    spec="$(ls /tmp/wheels-bot/gpu_runbook_bot-*.whl)"; \
    if [ -n "$BOT_EXTRAS" ]; then spec="gpu-runbook-bot[$BOT_EXTRAS] @ file://$spec"; fi; \
    "$VIRTUAL_ENV/bin/pip" install --no-cache-dir --no-index --no-deps "$spec"; \
    "$VIRTUAL_ENV/bin/pip" check; \
    rm -rf /tmp/wheels-bot; \
    groupadd --system --gid "$BOT_UID" runbook; \
    useradd --system --uid "$BOT_UID" --gid "$BOT_UID" --home-dir /var/lib/gpu-runbook-bot \
        --create-home --shell /usr/sbin/nologin runbook; \
    chmod 0750 /var/lib/gpu-runbook-bot; \
    runbook --help >/dev/null

USER ${BOT_UID}:${BOT_UID}
WORKDIR /var/lib/gpu-runbook-bot
EXPOSE 8080
# /healthz answers 200 while the database answers; no curl in the image, so Python's urllib.
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python3", "-c", "import os, sys, urllib.request; sys.exit(0 if urllib.request.urlopen(os.environ['RUNBOOK_HEALTH_URL'], timeout=4).status == 200 else 1)"]
# On 0.0.0.0 POST /alerts needs its bearer token: RUNBOOK_ALERTS_TOKEN (or a file named by
# server.alerts_token_file); without one `runbook serve` refuses to start (docs/operations.md).
# --init-db: the first start creates the database (`runbook db init`); other commands run in
# the image refuse a database that is not there.
CMD ["runbook", "serve", "--host", "0.0.0.0", "--init-db"]
