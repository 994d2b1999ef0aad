# ddpjob images: `--target operator` (kopf operator, no torch), `--target worker` (torch, ddp-worker) and
# `--target runtime` (the pure-Python worker runtime the operator injects into users' own images, and the
# rendezvous store's image).
#
#   docker build --target operator -t ddpjob-operator:dev .
#   docker build --target worker   -t ddpjob-worker:dev .
#   docker build --target runtime  -t ddpjob-runtime:dev .
#
# With network access that is all: pip installs from PyPI. Offline, put wheels into hack/wheelhouse/ and add
# `--build-arg PIP_ARGS=--no-index` (hack/images.sh does this from a wheelhouse downloaded on the host).
# Needs BuildKit (Docker's default builder since 23.0; DOCKER_BUILDKIT=1 on 20.10) for `RUN --mount`. No
# `# syntax=` line on purpose: it would pull a frontend image; the Dockerfile frontend built into BuildKit does.

# Pinned by tag; pin by digest (python:3.11-slim-bookworm@sha256:...) where your registry is reachable.
ARG BASE_IMAGE=python:3.11-slim-bookworm

FROM ${BASE_IMAGE} AS base
# Bytecode is compiled at install time; a read-only root filesystem must not be written at run time.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/opt/venv/bin:/opt/ddpjob/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
# A fixed numeric UID so Kubernetes can verify runAsNonRoot without a runAsUser. Written directly rather
# than with useradd, which minimal bases may lack.
RUN echo 'ddpjob:x:10001:10001:ddpjob:/home/ddpjob:/usr/sbin/nologin' >>/etc/passwd \
 && echo 'ddpjob:x:10001:' >>/etc/group \
 && mkdir -p /home/ddpjob && chown 10001:10001 /home/ddpjob

# Build stages. Dependencies go into /opt/venv, the project itself into /opt/ddpjob (found through a .pth
# file), so a code change rebuilds a layer of a few hundred KB instead of re-copying the torch-sized venv.
# The wheelhouse and the requirement lists are bind-mounted (BuildKit), never copied into a layer, and each
# final image is built FROM its dependency stage rather than COPYing the venv out of it: the 6 GB worker venv
# exists once on disk, not three times (wheel layer, build stage, final image).
FROM base AS requirements
# Only pyproject.toml here: the requirement lists come from it so they are defined in one place.
COPY pyproject.toml /src/
RUN mkdir /requirements \
 && python3 -c 'import tomllib; p = tomllib.load(open("/src/pyproject.toml", "rb"))["project"]; \
print("\n".join(p["dependencies"]))' >/requirements/operator.txt \
 && python3 -c 'import tomllib; p = tomllib.load(open("/src/pyproject.toml", "rb"))["project"]; \
print("\n".join(p["dependencies"] + p["optional-dependencies"]["torch"] + p["optional-dependencies"]["worker"]))' >/requirements/worker.txt

# deps-<image>: the virtualenv with the dependencies only (hack/image-venv.sh; pip removed at the end).
FROM base AS deps-operator
# Extra pip options, e.g. --no-index (offline, wheels from hack/wheelhouse/ only) or --index-url.
ARG PIP_ARGS=""
# setuptools goes too: nothing in the operator needs it at run time.
RUN --mount=type=bind,source=hack/wheelhouse,target=/tmp/build/wheelhouse \
    --mount=type=bind,from=requirements,source=/requirements,target=/tmp/build/requirements \
    --mount=type=bind,source=hack/image-venv.sh,target=/tmp/build/image-venv.sh \
    PIP_ARGS="${PIP_ARGS}" sh /tmp/build/image-venv.sh /tmp/build/requirements/operator.txt setuptools

FROM base AS deps-worker
ARG PIP_ARGS=""
# setuptools stays: torch declares it as a run-time dependency (torch.utils.cpp_extension).
RUN --mount=type=bind,source=hack/wheelhouse,target=/tmp/build/wheelhouse \
    --mount=type=bind,from=requirements,source=/requirements,target=/tmp/build/requirements \
    --mount=type=bind,source=hack/image-venv.sh,target=/tmp/build/image-venv.sh \
    PIP_ARGS="${PIP_ARGS}" sh /tmp/build/image-venv.sh /tmp/build/requirements/worker.txt

# project: ddpjob itself (both packages, the console scripts). Built with a throwaway venv at the same
# path as the real one so the scripts' `#!/opt/venv/bin/python` lines are right in the final images.
FROM base AS project
ARG PIP_ARGS=""
COPY pyproject.toml /src/
COPY operator/ /src/operator/
COPY worker/ /src/worker/
RUN --mount=type=bind,source=hack/wheelhouse,target=/tmp/build/wheelhouse \
    python3 -m venv /opt/venv \
 && PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PIP_ROOT_USER_ACTION=ignore \
    /opt/venv/bin/pip install --find-links /tmp/build/wheelhouse ${PIP_ARGS} --no-deps --target /opt/ddpjob /src

# The operator: `ddpjob operator` (the chart passes the flags). Metrics on 8080, kopf liveness on 8081.
FROM deps-operator AS operator
COPY --from=project /opt/ddpjob /opt/ddpjob
USER 10001:10001
WORKDIR /home/ddpjob
EXPOSE 8080 8081
ENTRYPOINT ["ddpjob"]
CMD ["operator"]

# The worker: torch (PyPI's default build, CUDA libraries included so one image serves CPU and GPU jobs)
# and the `ddp-worker` entrypoint that runs torchrun under the env contract set by the operator.
FROM deps-worker AS worker
COPY --from=project /opt/ddpjob /opt/ddpjob
USER 10001:10001
# torch and triton write caches under $HOME; the home directory is writable by the worker user.
ENV HOME=/home/ddpjob
WORKDIR /home/ddpjob
ENTRYPOINT ["ddp-worker"]

# The runtime's vendored boto3, for the checkpoint object-store tier (ddpjob_worker/objectstore.py): boto3 and its
# pure-Python dependencies (worker/vendor/requirements.txt) installed --no-deps from the wheelhouse into a directory of
# their own, which the runtime puts first on sys.path only when an object store is configured, then pruned to what an
# S3 client loads (worker/vendor/prune.py: botocore's models of every other AWS service go, 24 MB -> 5 MB). No
# bytecode, like the rest of the runtime. A stage of its own: a code change does not reinstall it.
FROM base AS runtime-vendor
ARG PIP_ARGS=""
RUN --mount=type=bind,source=hack/wheelhouse,target=/tmp/build/wheelhouse \
    --mount=type=bind,source=worker/vendor,target=/tmp/build/vendor \
    python3 -m venv /tmp/vendor-venv \
 && PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PIP_ROOT_USER_ACTION=ignore \
    /tmp/vendor-venv/bin/pip install --find-links /tmp/build/wheelhouse ${PIP_ARGS} --no-deps --no-compile \
      --target /opt/ddpjob-runtime/vendor -r /tmp/build/vendor/requirements.txt \
 && python3 /tmp/build/vendor/prune.py /opt/ddpjob-runtime/vendor \
 && rm -rf /tmp/vendor-venv

# The injected runtime (docs/worker.md): an init container of this image copies /opt/ddpjob-runtime into the worker
# pod, where the user's own Python and torch run it; the rendezvous pod runs bin/ddpjob-rdzv here with the base's
# python3. Only the package's source, the two launchers and vendor/ (above): no venv, no bytecode (.dockerignore
# keeps __pycache__ out; the user's Python may be another minor version than this one). FROM base, not from a
# dependency stage, so it stays the size of the base plus ~6 MB and a code change rebuilds only the last layers.
FROM base AS runtime
COPY --from=runtime-vendor /opt/ddpjob-runtime/vendor/ /opt/ddpjob-runtime/vendor/
COPY worker/ddpjob_worker/ /opt/ddpjob-runtime/lib/ddpjob_worker/
COPY worker/bin/ /opt/ddpjob-runtime/bin/
USER 10001:10001
WORKDIR /home/ddpjob
