# The obshub image: one image for the node agent, the stream workers and the rule engine (the Helm chart
# in deploy/helm/obshub runs /opt/obshub/.venv/bin/obshub with the command of each component).
#   docker build -t registry.example.internal/obshub:0.1.0 .
# bcc comes from Debian (python3-bpfcc, matching libbpfcc); the agent builds the kernel header tree of
# the node's kernel at start (from /sys/kernel/kheaders.tar.xz or the node's /usr/src, mounted by the chart).

FROM debian:bookworm-slim AS build
RUN apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
        python3 python3-venv python3-dev gcc libc6-dev systemtap-sdt-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/obshub
COPY pyproject.toml setup.py README.md ./
COPY obshub obshub
RUN python3 -m venv .venv \
    && .venv/bin/pip install --no-cache-dir --upgrade pip \
    && .venv/bin/pip install --no-cache-dir '.[all]'

FROM debian:bookworm-slim
RUN apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
        python3 python3-bpfcc libbpfcc xz-utils ca-certificates procps iproute2 \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/obshub
COPY --from=build /opt/obshub/.venv .venv
# the builtin pack at a fixed path the chart names (-r /opt/obshub/rules/builtin; the systemd unit: -r builtin)
COPY obshub/rules/builtin rules/builtin
# expose only Debian's bcc package to the venv (as scripts/setup.sh does)
RUN mkdir -p .venv/obshub-system \
    && ln -s /usr/lib/python3/dist-packages/bcc .venv/obshub-system/bcc \
    && echo /opt/obshub/.venv/obshub-system > "$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/obshub-system-bcc.pth" \
    && .venv/bin/python -c 'import bcc, obshub, obshub.producer, obshub.streams, obshub.rules' \
    && useradd --uid 10001 --no-create-home --home-dir /var/lib/obshub obshub \
    && mkdir -p /var/lib/obshub && chown 10001:10001 /var/lib/obshub
ENV OBSHUB_HOME=/var/lib/obshub OBSHUB_CACHE=/var/lib/obshub/cache PATH=/opt/obshub/.venv/bin:$PATH
USER 10001
ENTRYPOINT []
CMD ["/opt/obshub/.venv/bin/obshub", "--help"]
