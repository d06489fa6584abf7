# The node plugin's image (every component runs it) for those who build with docker, podman
# or buildah. It matches hack/image/build.sh, the offline builder `make release` uses
# (packages of hack/image/packages.txt on Debian bookworm, a venv at /opt/rukpak with the
# dependencies, pyfuse3 patched by hack/pyfuse3, the project's wheel; the same entrypoint):
#
#   docker build -t registry.example.com/rukpak-python:TAG .
#   docker buildx build --platform linux/amd64,linux/arm64 -t REF --push .
#   podman build -t REF .          buildah bud -t REF .
#
# Unlike `make release`, layers are not reproducible byte for byte (apt and pip date files).
ARG DEBIAN=docker.io/library/debian:bookworm-slim

FROM ${DEBIAN} AS build
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv python3-dev gcc libc6-dev \
        libfuse3-dev pkg-config ca-certificates \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# the dependencies first: a layer kept while only the sources change
COPY pyproject.toml README.md ./
COPY hack/pyfuse3 hack/pyfuse3
RUN python3 -m venv /opt/rukpak \
    && /opt/rukpak/bin/pip install --no-cache-dir --disable-pip-version-check "setuptools>=77" \
    && python3 -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; \
print(*[d for d in p["dependencies"] + p["optional-dependencies"]["node"] if not d.startswith("pyfuse3")], sep="\n")' \
        > /tmp/requirements.txt \
    && /opt/rukpak/bin/pip install --no-cache-dir --disable-pip-version-check -r /tmp/requirements.txt \
    && bash hack/pyfuse3/build.sh /opt/rukpak/bin/pip /tmp/wheels \
    && /opt/rukpak/bin/pip install --no-cache-dir --no-deps /tmp/wheels/pyfuse3-*.whl
COPY rukpak rukpak
COPY csi csi
COPY provisioner provisioner
RUN /opt/rukpak/bin/pip install --no-cache-dir --no-deps --disable-pip-version-check .

FROM ${DEBIAN}
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv libfuse3-3 fuse3 util-linux \
        ca-certificates \
    && rm -rf /var/lib/apt/lists/* /usr/share/doc/* /usr/share/man/*
COPY --from=build /opt/rukpak /opt/rukpak
ENV PATH=/opt/rukpak/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONUNBUFFERED=1
LABEL org.opencontainers.image.title=rukpak-python \
      org.opencontainers.image.source=https://github.com/operator-framework/rukpak
WORKDIR /
ENTRYPOINT ["/opt/rukpak/bin/rukpak-csi-plugin"]
