#!/usr/bin/env bash
# Builds ddpjob-operator:dev, ddpjob-worker:dev and ddpjob-runtime:dev from the Dockerfile (used by `make images`, CI
# and the e2e tier), also on a machine that cannot pull images or reach HTTPS from inside containers: the wheels are
# downloaded on the host, and the base image is pulled or, where no registry answers, stood in for (step 3). The
# operator and runtime images are also tagged with the chart's appVersion (charts/ddpjob-operator/Chart.yaml), the
# tags `helm install` with default values deploys.
#
#   hack/images.sh            install docker.io if missing, start dockerd if none runs, build the three images
#   hack/images.sh --e2e      the same, plus the e2e tier's plain user image ddpjob-plain:torch-<oldest supported>
#                             (tests/e2e/images/plain/Dockerfile: python + torch + a script, nothing of ddpjob)
#                             and its framework image ddpjob-frameworks:torch-<oldest supported> (the plain image +
#                             transformers, accelerate, lightning and four user scripts; tests/e2e/images/frameworks)
#   hack/images.sh --stop     stop the dockerd this script started (never one it did not start)
#   hack/images.sh --running  exit 0 when a dockerd this script started runs (hack/e2e.sh, hack/test.sh)
#
# Steps, each cached so a warm run only re-checks them:
#   1. docker.io from Debian (apt-get) when `dockerd` is missing.
#   2. dockerd in the background when the daemon does not answer. It runs with --iptables=false and
#      --ip-forward=false so the host's iptables and sysctls stay as they were (builds need no network:
#      everything comes from the wheelhouse). Its PID is kept in $CACHE/dockerd.pid for --stop; it is left
#      running on purpose so the next build and the e2e tier reuse it.
#   3. The base image `python:3.11-slim-bookworm`: the official one, pulled when missing; only where it cannot be
#      pulled a local stand-in (debootstrap minbase + python3, `docker import`; Debian bookworm's python3 is 3.11)
#      under its own name, ddpjob-local/python:3.11-slim-bookworm, passed to every build as BASE_IMAGE.
#   4. The wheelhouse: wheels for every dependency, downloaded on the host (which trusts the local CA)
#      with the versions pinned to those in .venv, into $CACHE/wheelhouse (outside the repo).
#   5. A build context in $CACHE/image-context: the repo's git-visible files plus the wheels hardlinked into
#      hack/wheelhouse/, then `docker build --target operator|worker` with PIP_ARGS=--no-index; the runtime target
#      from $CACHE/runtime-context (worker/ and the wheels of its vendored boto3, $CACHE/wheelhouse-runtime).
#   6. With --e2e: `pip download torch==<version>` on the host into $CACHE/wheelhouse-torch-<version> (once per
#      version; the version is the first word of TORCH_COMPAT_VERSIONS in hack/versions.env), a context of the
#      Dockerfile, the tutorial script and those wheels in $CACHE/plain-context, and `docker build` of it.
#   7. With --e2e: the framework image FROM the plain one. `pip download` of FRAMEWORKS_PINS (hack/versions.env)
#      against that torch into $CACHE/wheelhouse-frameworks-<hash of the pins and torch version> (once; torch's own
#      wheels are neither fetched again nor kept), a context of tests/e2e/images/frameworks/Dockerfile, the scripts
#      of tests/e2e/scripts/frameworks/ and those wheels in $CACHE/frameworks-context, and `docker build` of it.
#   8. The build cache capped (least recently used records above DDPJOB_BUILD_CACHE_KEEP, default 12GB, go).
# Environment: DDPJOB_CACHE (default ~/.cache/ddpjob), TAG (default dev), DOCKER (client binary),
# DDPJOB_BUILD_CACHE_KEEP (step 8), DDPJOB_DOCKER_ROOT (--data-root of a dockerd this script starts: a disk with
# room for the ~9 GB of images and build cache, or an empty directory to measure a cold build), DEBIAN_MIRROR
# (debootstrap's mirror; default: the machine's own apt source).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
REPO=$PWD
CACHE=${DDPJOB_CACHE:-$HOME/.cache/ddpjob}
TAG=${TAG:-dev}
APP_VERSION=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' charts/ddpjob-operator/Chart.yaml)
BASE_IMAGE=python:3.11-slim-bookworm
# The offline stand-in's own name, and the note `docker import` gives it (how an older one is recognised).
STANDIN=ddpjob-local/python:3.11-slim-bookworm
STANDIN_NOTE="local stand-in for $BASE_IMAGE (debootstrap minbase bookworm + python3)"
PIDFILE=$CACHE/dockerd.pid
mkdir -p "$CACHE"

log() { printf '[images %s] %s\n' "$(date +%H:%M:%S)" "$*"; }
t_start=$(date +%s)
step_t=$t_start
took() { local now; now=$(date +%s); log "$1 ($(( now - step_t )) s)"; step_t=$now; }

started_dockerd() {
  [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null \
    && [ "$(ps -o comm= -p "$(cat "$PIDFILE")")" = dockerd ]
}

E2E=0
if [ "${1:-}" = "--e2e" ]; then
  E2E=1
  shift
fi

if [ "${1:-}" = "--running" ]; then
  started_dockerd
  exit
fi

if [ "${1:-}" = "--stop" ]; then
  if started_dockerd; then
    pid=$(cat "$PIDFILE")
    log "stopping dockerd (pid $pid, started by this script)"
    kill "$pid"
    for _ in $(seq 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    rm -f "$PIDFILE"
  else
    log "no dockerd started by this script is running; nothing to stop"
  fi
  exit 0
fi

# Debian's client is preferred when present: its built-in BuildKit needs no buildx plugin, and BuildKit
# sends only the changed files of the (multi-GB) build context on a warm build.
if [ -z "${DOCKER:-}" ]; then
  if [ -x /usr/bin/docker ]; then DOCKER=/usr/bin/docker; else DOCKER=docker; fi
fi

# 1. Docker from Debian.
if ! command -v dockerd >/dev/null; then
  log "installing docker.io from Debian"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io >/dev/null
  [ -x /usr/bin/docker ] && DOCKER=/usr/bin/docker
  took "docker.io installed"
fi

# 2. The daemon.
if ! "$DOCKER" info >/dev/null 2>&1; then
  log "starting dockerd (log: $CACHE/dockerd.log, pid file: $PIDFILE)"
  # setsid: the daemon must outlive this script and not get the terminal's signals. At normal CPU and I/O
  # priority whatever this script's (hack/test.sh runs it at the lowest, beside test-fast): the daemon outlives
  # that, and the e2e tier's image import and tests/images go through it.
  nice -n "$(( -$(nice) ))" ionice -c 2 -n 4 setsid dockerd --iptables=false --ip-forward=false ${DDPJOB_DOCKER_ROOT:+--data-root "$DDPJOB_DOCKER_ROOT"} \
    >"$CACHE/dockerd.log" 2>&1 </dev/null &
  echo $! >"$PIDFILE"
  for _ in $(seq 120); do "$DOCKER" info >/dev/null 2>&1 && break; sleep 0.5; done
  "$DOCKER" info >/dev/null 2>&1 || { tail -n 30 "$CACHE/dockerd.log"; exit 1; }
  took "dockerd up"
fi
# BuildKit (the Dockerfile bind-mounts the wheelhouse): buildx, or Debian's 20.10 client which has it built in.
client=$("$DOCKER" version -f '{{.Client.Version}}' 2>/dev/null || true)
if ! "$DOCKER" buildx version >/dev/null 2>&1 && [[ $client != 20.* ]]; then
  echo "images: the Dockerfile needs BuildKit, but $DOCKER (client $client) has no buildx plugin." \
    "Install Docker's buildx plugin, or use Debian's docker.io 20.10 client, which has BuildKit built in" \
    "(apt-get install docker.io; DOCKER=/usr/bin/docker)." >&2
  exit 1
fi
export DOCKER_BUILDKIT=1
progress=(--progress=plain)

# 3. The base image: the official one when the daemon has it or can pull it; else (no registry reachable, as on
#    this project's machines) a local stand-in under a name of its own, never over the official tag. An older
#    version of this script imported the stand-in as $BASE_IMAGE itself: it is moved to $STANDIN here (a retag: the
#    image ID, and so every build cached on it, stays the same).
if [ "$("$DOCKER" image inspect -f '{{.Comment}}' "$BASE_IMAGE" 2>/dev/null)" = "$STANDIN_NOTE" ]; then
  "$DOCKER" tag "$BASE_IMAGE" "$STANDIN" && "$DOCKER" rmi "$BASE_IMAGE" >/dev/null
  log "the stand-in an older images.sh imported as $BASE_IMAGE is now $STANDIN"
fi
if "$DOCKER" image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
  base=$BASE_IMAGE
elif "$DOCKER" image inspect "$STANDIN" >/dev/null 2>&1; then
  base=$STANDIN
elif log "pulling $BASE_IMAGE" && timeout 300 "$DOCKER" pull -q "$BASE_IMAGE" >"$CACHE/pull-base.log" 2>&1; then
  base=$BASE_IMAGE
  took "base image $BASE_IMAGE pulled"
else
  log "cannot pull $BASE_IMAGE ($(tail -n 1 "$CACHE/pull-base.log")): building the stand-in $STANDIN"
  command -v debootstrap >/dev/null || { apt-get update -qq; apt-get install -y -qq debootstrap >/dev/null; }
  # The machine's own Debian mirror (the repository names none): DEBIAN_MIRROR, else apt's first source.
  mirror=${DEBIAN_MIRROR:-$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '/^URIs:/ {print $2; exit}')}
  mirror=${mirror:-$(awk '$1 == "deb" {print ($2 ~ /^\[/ ? $3 : $2); exit}' /etc/apt/sources.list 2>/dev/null)}
  if [ -z "$mirror" ]; then
    echo "images: no Debian mirror for debootstrap: apt has no source (/etc/apt/sources.list.d/*.sources," \
      "/etc/apt/sources.list); set DEBIAN_MIRROR=<your Debian mirror's URL>" >&2
    exit 1
  fi
  rootfs=$(mktemp -d "$CACHE/rootfs.XXXXXX")
  log "debootstrap bookworm into $rootfs (mirror $mirror)"
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$rootfs" \
    "$mirror" >"$CACHE/debootstrap.log" 2>&1 \
    || { tail -n 30 "$CACHE/debootstrap.log"; exit 1; }
  # Trim what an image never needs (apt lists, caches, docs); the official slim image does the same.
  rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/* "$rootfs"/usr/share/doc/* \
    "$rootfs"/usr/share/man/* "$rootfs"/usr/share/locale/*
  tar -C "$rootfs" -c . | "$DOCKER" import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' -m "$STANDIN_NOTE" - "$STANDIN" >/dev/null
  rm -rf "$rootfs"
  base=$STANDIN
  took "base image stand-in $STANDIN imported"
fi

# 4. The wheelhouse, pinned to the versions the tests ran with.
WHEELHOUSE=$CACHE/wheelhouse
mkdir -p "$WHEELHOUSE"
reqs=$("$REPO/.venv/bin/python" - <<'EOF'
import tomllib
p = tomllib.load(open("pyproject.toml", "rb"))["project"]
extras = p["optional-dependencies"]
print("\n".join(p["dependencies"] + extras["torch"] + extras["worker"] + ["setuptools>=77", "wheel"]))
EOF
)
stamp=$WHEELHOUSE/.stamp
want=$({ echo "$reqs"; "$REPO/.venv/bin/python" -m pip freeze --exclude-editable; } | sha256sum | cut -c1-16)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  log "downloading wheels into $WHEELHOUSE"
  "$REPO/.venv/bin/python" -m pip freeze --exclude-editable >"$WHEELHOUSE/constraints.txt"
  echo "$reqs" >"$WHEELHOUSE/requirements.txt"
  "$REPO/.venv/bin/python" -m pip download -q --progress-bar off --only-binary=:all: -d "$WHEELHOUSE" \
    -c "$WHEELHOUSE/constraints.txt" -r "$WHEELHOUSE/requirements.txt"
  echo "$want" >"$stamp"
  took "wheelhouse ready ($(du -sh "$WHEELHOUSE" | cut -f1))"
fi

# 5. Build context and images.
CTX=$CACHE/image-context
rm -rf "$CTX" && mkdir -p "$CTX"
# Tracked and new (not ignored) files only: no .venv, .cluster or caches in the context.
git ls-files -co --exclude-standard -z | tar --null --ignore-failed-read -T - -c 2>/dev/null | tar -C "$CTX" -x
mkdir -p "$CTX/hack/wheelhouse"
cp -al "$WHEELHOUSE"/*.whl "$CTX/hack/wheelhouse/" 2>/dev/null || cp "$WHEELHOUSE"/*.whl "$CTX/hack/wheelhouse/"
took "build context staged in $CTX"
# build IMAGE LOG docker-build-arguments...: build, log the size, and drop the image this build replaced.
build() {
  local image=$1 logfile=$2 old
  shift 2
  log "docker build -t $image"
  old=$("$DOCKER" image inspect -f '{{.Id}}' "$image" 2>/dev/null || true)
  "$DOCKER" build "${progress[@]}" -t "$image" "$@" >"$logfile" 2>&1 || { tail -n 40 "$logfile"; exit 1; }
  took "$image built, $("$DOCKER" image inspect -f '{{.Size}}' "$image" | awk '{printf "%.0f MB", $1/1e6}')"
  # The image this build replaced is now untagged; after a dependency change it pins a 6 GB venv layer. Only
  # that image goes (a container or another tag using it keeps it: rmi then fails, and that is fine).
  if [ -n "$old" ] && [ "$old" != "$("$DOCKER" image inspect -f '{{.Id}}' "$image")" ]; then
    "$DOCKER" rmi "$old" >/dev/null 2>&1 || true
  fi
}
build "ddpjob-operator:$TAG" "$CACHE/build-operator.log" -t "ddpjob-operator:$APP_VERSION" --target operator \
  --build-arg "BASE_IMAGE=$base" --build-arg PIP_ARGS=--no-index "$CTX"
build "ddpjob-worker:$TAG" "$CACHE/build-worker.log" --target worker --build-arg "BASE_IMAGE=$base" \
  --build-arg PIP_ARGS=--no-index "$CTX"
# The runtime from a context of its own (worker/ only): BuildKit keeps one copy of a context directory and syncs it to
# the paths the target uses, so a runtime build from $CTX would drop the wheels from that copy and the next operator
# build would send all 3 GB again (~25 s instead of ~1 s). Plus the few wheels of the runtime's vendored boto3
# (worker/vendor/requirements.txt; ~17 MB, 16 of them botocore's) in its own hack/wheelhouse/: downloaded once into
# $CACHE/wheelhouse-runtime, at the versions of .venv (the wheelhouse's constraints.txt) so the runtime carries what
# the tests ran.
RUNTIME_WHEELHOUSE=$CACHE/wheelhouse-runtime
runtime_want=$(cat worker/vendor/requirements.txt "$WHEELHOUSE/constraints.txt" | sha256sum | cut -c1-16)
if [ "$(cat "$RUNTIME_WHEELHOUSE/.stamp" 2>/dev/null)" != "$runtime_want" ]; then
  log "downloading the runtime's vendored wheels into $RUNTIME_WHEELHOUSE"
  rm -rf "$RUNTIME_WHEELHOUSE" && mkdir -p "$RUNTIME_WHEELHOUSE"
  "$REPO/.venv/bin/python" -m pip download -q --progress-bar off --only-binary=:all: --no-deps \
    -d "$RUNTIME_WHEELHOUSE" -c "$WHEELHOUSE/constraints.txt" -r worker/vendor/requirements.txt
  echo "$runtime_want" >"$RUNTIME_WHEELHOUSE/.stamp"
  took "runtime wheelhouse ready ($(du -sh "$RUNTIME_WHEELHOUSE" | cut -f1))"
fi
RUNTIME_CTX=$CACHE/runtime-context
rm -rf "$RUNTIME_CTX" && mkdir -p "$RUNTIME_CTX/hack/wheelhouse"
cp -a "$CTX/worker" "$CTX/.dockerignore" "$RUNTIME_CTX/"
cp -al "$RUNTIME_WHEELHOUSE"/*.whl "$RUNTIME_CTX/hack/wheelhouse/" 2>/dev/null \
  || cp "$RUNTIME_WHEELHOUSE"/*.whl "$RUNTIME_CTX/hack/wheelhouse/"
build "ddpjob-runtime:$TAG" "$CACHE/build-runtime.log" -t "ddpjob-runtime:$APP_VERSION" --target runtime \
  --build-arg "BASE_IMAGE=$base" --build-arg PIP_ARGS=--no-index -f "$CTX/Dockerfile" "$RUNTIME_CTX"

# 6. The e2e tier's plain user image: torch of the oldest supported release and nothing of ours.
if [ "$E2E" = 1 ]; then
  # shellcheck disable=SC1091  # KEY=value lines only
  torch_versions=$(. hack/versions.env && echo "${TORCH_COMPAT_VERSIONS:-}")
  torch_version=${torch_versions%% *}
  torch_version=${torch_version:-2.6.0}
  PLAIN_WHEELHOUSE=$CACHE/wheelhouse-torch-$torch_version
  if [ ! -f "$PLAIN_WHEELHOUSE/.complete" ]; then
    log "downloading torch==$torch_version and its dependencies into $PLAIN_WHEELHOUSE"
    rm -rf "$PLAIN_WHEELHOUSE" && mkdir -p "$PLAIN_WHEELHOUSE"
    # The host's pip configuration (index, CA) applies; the image's Python is the same 3.11 on x86_64.
    "$REPO/.venv/bin/python" -m pip download -q --progress-bar off --only-binary=:all: -d "$PLAIN_WHEELHOUSE" \
      "torch==$torch_version"
    touch "$PLAIN_WHEELHOUSE/.complete"
    took "torch $torch_version wheelhouse ready ($(du -sh "$PLAIN_WHEELHOUSE" | cut -f1))"
  fi
  PLAIN_CTX=$CACHE/plain-context
  rm -rf "$PLAIN_CTX" && mkdir -p "$PLAIN_CTX/wheelhouse"
  cp tests/e2e/images/plain/Dockerfile "$PLAIN_CTX/"
  cp tests/e2e/images/plain/train.py "$PLAIN_CTX/train.py"
  cp -al "$PLAIN_WHEELHOUSE"/*.whl "$PLAIN_CTX/wheelhouse/" 2>/dev/null || cp "$PLAIN_WHEELHOUSE"/*.whl "$PLAIN_CTX/wheelhouse/"
  build "ddpjob-plain:torch-$torch_version" "$CACHE/build-plain.log" --build-arg "TORCH_VERSION=$torch_version" \
    --build-arg "BASE_IMAGE=$base" --build-arg PIP_ARGS=--no-index "$PLAIN_CTX"
fi

# 7. The e2e tier's framework user image: the plain image plus transformers, accelerate and lightning (pinned in
#    hack/versions.env) and four user scripts, still nothing of ours. Its own step: it reuses section 6's torch
#    version, wheelhouse and image, and the build() helper of step 5.
if [ "$E2E" = 1 ]; then
  # shellcheck disable=SC1091  # KEY=value lines only
  frameworks_pins=$(. hack/versions.env && echo "${FRAMEWORKS_PINS:-}")
  if [ -z "$frameworks_pins" ]; then
    echo "images: FRAMEWORKS_PINS is missing from hack/versions.env" >&2
    exit 1
  fi
  fw_key=$(echo "torch==$torch_version $frameworks_pins" | sha256sum | cut -c1-16)
  FW_WHEELHOUSE=$CACHE/wheelhouse-frameworks-$fw_key
  if [ ! -f "$FW_WHEELHOUSE/.complete" ]; then
    log "downloading $frameworks_pins and their dependencies for torch $torch_version into $FW_WHEELHOUSE"
    rm -rf "$FW_WHEELHOUSE" && mkdir -p "$FW_WHEELHOUSE"
    # Resolved together with the plain image's torch, so that nothing needs another one. Its wheels, hard-linked in
    # first, count as downloaded already (pip takes a file that its download directory holds) and go again after:
    # the image has them installed, so the wheelhouse holds only what the frameworks add.
    cp -al "$PLAIN_WHEELHOUSE"/*.whl "$FW_WHEELHOUSE/" 2>/dev/null || cp "$PLAIN_WHEELHOUSE"/*.whl "$FW_WHEELHOUSE/"
    # shellcheck disable=SC2086  # the pins are a list of requirement specifiers
    "$REPO/.venv/bin/python" -m pip download -q --progress-bar off --only-binary=:all: -d "$FW_WHEELHOUSE" \
      "torch==$torch_version" $frameworks_pins
    for whl in "$PLAIN_WHEELHOUSE"/*.whl; do rm -f "$FW_WHEELHOUSE/${whl##*/}"; done
    echo "$frameworks_pins" >"$FW_WHEELHOUSE/pins.txt"
    touch "$FW_WHEELHOUSE/.complete"
    took "frameworks wheelhouse ready ($(du -sh "$FW_WHEELHOUSE" | cut -f1))"
  fi
  FW_CTX=$CACHE/frameworks-context
  rm -rf "$FW_CTX" && mkdir -p "$FW_CTX/wheelhouse" "$FW_CTX/scripts"
  cp tests/e2e/images/frameworks/Dockerfile "$FW_CTX/"
  cp tests/e2e/scripts/frameworks/*.py "$FW_CTX/scripts/"
  cp -al "$FW_WHEELHOUSE"/*.whl "$FW_CTX/wheelhouse/" 2>/dev/null || cp "$FW_WHEELHOUSE"/*.whl "$FW_CTX/wheelhouse/"
  build "ddpjob-frameworks:torch-$torch_version" "$CACHE/build-frameworks.log" \
    --build-arg "BASE_IMAGE=ddpjob-plain:torch-$torch_version" --build-arg "FRAMEWORKS_PINS=$frameworks_pins" \
    --build-arg PIP_ARGS=--no-index "$FW_CTX"
fi

# 8. Disk: the build cache of superseded builds (a dependency change leaves a 6 GB venv layer's cache behind; after
#    one `make demo` and one `make test` the daemon held 35 GB of it, 2026-11-29). BuildKit drops the least recently
#    used records above the cap first, so the ones each build above just used stay while they fit (about 6.3 GB for
#    all five images, 2026-11-29): they keep the next build a 3-second cache check with the same image IDs.
#    DDPJOB_BUILD_CACHE_KEEP sets the cap (default 12GB, about twice that).
pruned=$("$DOCKER" builder prune -f --keep-storage "${DDPJOB_BUILD_CACHE_KEEP:-12GB}" 2>&1 | tail -n 1)
log "build cache capped at ${DDPJOB_BUILD_CACHE_KEEP:-12GB}: ${pruned:-nothing to reclaim}"
log "done in $(( $(date +%s) - t_start )) s"
