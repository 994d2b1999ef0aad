#!/usr/bin/env bash
# Builds the pinned cluster tools (Kubernetes control plane, etcd, kwok, helm, scheduler-plugins' scheduler, Kueue,
# Prometheus' promtool, SeaweedFS' weed, distribution's registry; kubelet, kube-proxy and CoreDNS with --node) from
# their Go modules into a cache outside the repo, keyed by version.
# A tool already in the cache is skipped, so a warm run takes well under a second.
#
# Usage: hack/install-tools.sh [--core] [--node] [--print-dir]
#   --core         only what a plain cluster runs (control plane, etcd, helm, and kwok without --node): for `make
#                  demo` (issue 44), which starts no Kueue, scheduler-plugins, Prometheus, SeaweedFS or registry.
#                  Those are most of a cold build on 2 cores (SeaweedFS' weed alone: 29 min beside other builds).
#   DDPJOB_CACHE   cache root (default ~/.cache/ddpjob); binaries land in $DDPJOB_CACHE/bin/<tool>-<version>/
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"
CACHE=${DDPJOB_CACHE:-$HOME/.cache/ddpjob}
export GOFLAGS=-buildvcs=false
export GOTOOLCHAIN=local

want_node=0 want_core=0
for arg in "$@"; do
  case $arg in
    --node) want_node=1 ;;
    --core) want_core=1 ;;
    --print-dir) echo "$CACHE/bin"; exit 0 ;;
    *) echo "unknown argument: $arg (expected --core, --node or --print-dir)" >&2; exit 2 ;;
  esac
done

start=$(date +%s)
elapsed() { local s=$(( $(date +%s) - ${1:-$start} )); printf '%dm%02ds' $((s / 60)) $((s % 60)); }
say() { printf '[install-tools %s] %s\n' "$(elapsed)" "$*"; }

# run_logged LOG DESCRIPTION CMD...: runs CMD with output to LOG, printing a heartbeat every 30 s,
# and on failure shows the tool's own error output instead of a bare exit code.
run_logged() {
  local log=$1 what=$2; shift 2
  local t0; t0=$(date +%s)
  ( "$@" ) >"$log" 2>&1 &
  local pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    for _ in $(seq 30); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    kill -0 "$pid" 2>/dev/null && say "  ... still $what ($(elapsed "$t0"))"
  done
  if ! wait "$pid"; then
    say "FAILED: $what. Last lines of $log:"
    tail -n 60 "$log" | sed 's/^/    /' >&2
    exit 1
  fi
  say "  done: $what in $(elapsed "$t0")"
}

# gomodule DIR MODULE VERSION [REPLACES...]: a throwaway module that requires MODULE@VERSION, so its
# main packages can be built even when MODULE's own go.mod has replace directives (go install refuses those).
gomodule() {
  local dir=$1 mod=$2 ver=$3; shift 3
  mkdir -p "$dir"
  {
    echo "module ddpjob.local/toolbuild"
    echo "go 1.24"
    echo "require $mod $ver"
    for r in "$@"; do echo "replace $r"; done
  } >"$dir/go.mod"
}

k8s_staging=(api apiextensions-apiserver apimachinery apiserver cli-runtime client-go cloud-provider
  cluster-bootstrap code-generator component-base component-helpers controller-manager cri-api cri-client
  csi-translation-lib dynamic-resource-allocation endpointslice externaljwt kms kube-aggregator
  kube-controller-manager kube-proxy kube-scheduler kubectl kubelet metrics mount-utils
  pod-security-admission sample-apiserver sample-cli-plugin sample-controller)

k8s_ldflags() {
  local v=${KUBERNETES_VERSION#v} p=k8s.io/component-base/version c=k8s.io/client-go/pkg/version
  local major=${v%%.*} minor; minor=${v#*.}; minor=${minor%%.*}
  local flags="-s -w"
  for pkg in $p $c; do
    flags+=" -X $pkg.gitVersion=$KUBERNETES_VERSION -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
    flags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  echo "$flags"
}

# Each entry: name|version|module|package|ldflags-kind
tools=(
  "kube-apiserver|$KUBERNETES_VERSION|k8s.io/kubernetes|k8s.io/kubernetes/cmd/kube-apiserver|k8s"
  "kube-controller-manager|$KUBERNETES_VERSION|k8s.io/kubernetes|k8s.io/kubernetes/cmd/kube-controller-manager|k8s"
  "kube-scheduler|$KUBERNETES_VERSION|k8s.io/kubernetes|k8s.io/kubernetes/cmd/kube-scheduler|k8s"
  "etcd|$ETCD_VERSION|go.etcd.io/etcd/server/v3|go.etcd.io/etcd/server/v3|plain"
  "kwok|$KWOK_VERSION|sigs.k8s.io/kwok|sigs.k8s.io/kwok/cmd/kwok|plain"
  "helm|$HELM_VERSION|helm.sh/helm/v3|helm.sh/helm/v3/cmd/helm|plain"
  "scheduler-plugins|$SCHEDULER_PLUGINS_VERSION|sigs.k8s.io/scheduler-plugins|sigs.k8s.io/scheduler-plugins/cmd/scheduler|plain"
  # Kueue's go.mod has no replace directives: nothing to repeat in replaces_of.
  "kueue|$KUEUE_VERSION|sigs.k8s.io/kueue|sigs.k8s.io/kueue/cmd/kueue|kueue"
  # Built without service discovery (build_tags: its cloud SDKs), which rule and metric checks never use: 94 s cold
  # instead of 247 s on 2 cores.
  "promtool|$PROMETHEUS_VERSION|github.com/prometheus/prometheus|github.com/prometheus/prometheus/cmd/promtool|plain"
  # The server, for `kubectl ddpjob report --prometheus` and the dashboard's queries against a real scrape (static
  # targets only, no web UI assets: the API alone). 48 s after promtool with an empty Go build cache (they share
  # most packages), 2 cores, load about 2.
  "prometheus|$PROMETHEUS_VERSION|github.com/prometheus/prometheus|github.com/prometheus/prometheus/cmd/prometheus|plain"
  # SeaweedFS' all-in-one `weed mini` (master, volume, filer, S3): the S3-compatible object store the object-store
  # tier's tests run against (tests/cluster/objectstore.py). Its module has no semver tags (a pseudo-version); its
  # go.mod's one replace (go-bip39) is for a module weed never loads, so none is repeated. Every filer store and cloud
  # SDK comes with it (1739 packages; no build tag leaves them out): 29m23s with an empty Go build cache, modules
  # downloaded, on 2 cores beside other builds (load about 9.5; 940 s of CPU); a 164 MB binary.
  "weed|$SEAWEEDFS_VERSION|github.com/seaweedfs/seaweedfs|github.com/seaweedfs/seaweedfs/weed|weed"
  # CNCF distribution's registry: where tests/images pushes the images (`make push`) and the chart (`helm
  # push`), as a platform team's registry. No replace directives in its go.mod.
  "registry|$DISTRIBUTION_VERSION|github.com/distribution/distribution/v3|github.com/distribution/distribution/v3/cmd/registry|plain"
)
# The core, by name: the control plane, etcd and helm, and kwok unless --node (a plain cluster with a real node does
# not start kwok's simulated nodes: tests/cluster/controlplane.py).
if [ "$want_core" = 1 ]; then
  core=" kube-apiserver kube-controller-manager kube-scheduler etcd helm "
  [ "$want_node" = 1 ] || core+="kwok "
  all=("${tools[@]}") tools=()
  for entry in "${all[@]}"; do [[ $core == *" ${entry%%|*} "* ]] && tools+=("$entry"); done
fi
if [ "$want_node" = 1 ]; then
  tools+=(
    "kubelet|$KUBERNETES_VERSION|k8s.io/kubernetes|k8s.io/kubernetes/cmd/kubelet|k8s"
    "kube-proxy|$KUBERNETES_VERSION|k8s.io/kubernetes|k8s.io/kubernetes/cmd/kube-proxy|k8s"
    "coredns|$COREDNS_VERSION|github.com/coredns/coredns|github.com/coredns/coredns|plain"
  )
fi

n=${#tools[@]} k=0 built=0
mkdir -p "$CACHE/bin" "$CACHE/logs" "$CACHE/src"

# Every tool asked for is there: done, without waiting for the lock (make test's test-fast checks the control-plane
# tools while the node tools build beside it, and waited two minutes for that build on a cold machine).
missing=0
for entry in "${tools[@]}"; do
  IFS='|' read -r name ver _ <<<"$entry"
  [ -x "$CACHE/bin/$name-$ver/$name" ] || missing=1
done
if [ "$missing" = 0 ]; then
  say "all $n tools ready in $CACHE/bin (cached)"
  exit 0
fi
# One build at a time per cache: two runs (a test that asks for a missing tool while `make tools` builds) would
# build into the same temporary files and one would fail on the other's rename.
exec 9>"$CACHE/.install-tools.lock"
flock 9

# srcdir MODULE VERSION: the throwaway module's directory (one per module and version: kubelet shares the
# kube-apiserver's).
srcdir() { echo "$CACHE/src/${1//\//_}-$2"; }

# replaces_of MODULE VERSION: the replace directives its throwaway module needs.
replaces_of() {
  local mod=$1 ver=$2 s spk
  if [ "$mod" = k8s.io/kubernetes ]; then
    for s in "${k8s_staging[@]}"; do echo "k8s.io/$s => k8s.io/$s v0.${ver#v1.}"; done
  elif [ "$mod" = sigs.k8s.io/scheduler-plugins ]; then
    # Its own go.mod's replaces do not apply to a module that requires it: repeat them, at the served patch.
    spk=$SCHEDULER_PLUGINS_K8S_VERSION
    for s in "${k8s_staging[@]}"; do echo "k8s.io/$s => k8s.io/$s v0.${spk#v1.}"; done
    echo "k8s.io/kubernetes => k8s.io/kubernetes $spk"
  fi
}

# The module downloads of every tool still to build, one module after another in the background: on a cold
# cache they are minutes of waiting on the network per tool, which now pass while the first tool compiles.
# A build starts only once its own module is downloaded (a marker), so the two never write one go.mod at once.
# build_tags PKG: Go build tags for a tool (Prometheus' remove_all_sd drops every service-discovery plugin).
build_tags() { case "$1" in github.com/prometheus/prometheus/cmd/*) echo remove_all_sd ;; esac; }

prefetch=()
for entry in "${tools[@]}"; do
  IFS='|' read -r name ver mod pkg kind <<<"$entry"
  [ -x "$CACHE/bin/$name-$ver/$name" ] && continue
  src=$(srcdir "$mod" "$ver")
  rm -f "$src/.fetched"
  mapfile -t replaces < <(replaces_of "$mod" "$ver")
  gomodule "$src" "$mod" "$ver" "${replaces[@]}"
  prefetch+=("$src|$mod|$pkg")
done
fetch_pid=
if [ ${#prefetch[@]} -gt 0 ]; then
  (
    for item in "${prefetch[@]}"; do
      IFS='|' read -r src mod pkg <<<"$item"
      [ -f "$src/.fetched" ] && continue
      (cd "$src" && go mod download "$mod" && go list -mod=mod -tags "$(build_tags "$pkg")" -deps "$pkg" >/dev/null) \
        >"$CACHE/logs/fetch-${src##*/}.log" 2>&1
      touch "$src/.fetched"  # also after a failure: the build then downloads, and shows the error itself
    done
  ) &
  fetch_pid=$!
  # Keeps the script's own exit status: set -e also holds in the trap, where a failed kill of a finished
  # prefetch would end the script with 1.
  trap 'rc=$?; kill "$fetch_pid" 2>/dev/null || true; exit $rc' EXIT
fi

for entry in "${tools[@]}"; do
  IFS='|' read -r name ver mod pkg kind <<<"$entry"
  k=$((k + 1))
  out="$CACHE/bin/$name-$ver/$name"
  if [ -x "$out" ]; then
    say "[$k/$n] $name $ver: cached at $out"
    continue
  fi
  say "[$k/$n] $name $ver: building from $mod (a cold build on 2 cores takes minutes)"
  src=$(srcdir "$mod" "$ver")
  while [ ! -f "$src/.fetched" ] && kill -0 "$fetch_pid" 2>/dev/null; do sleep 1; done
  ldflags="-s -w"
  [ "$kind" = k8s ] && ldflags=$(k8s_ldflags)
  if [ "$name" = etcd ]; then
    ldflags+=" -X go.etcd.io/etcd/api/v3/version.GitSHA=${ver}"
  fi
  # The version its log's first line reports (unset, it says v0.0.0-main).
  [ "$kind" = kueue ] && ldflags+=" -X sigs.k8s.io/kueue/pkg/version.GitVersion=${ver}"
  # `weed version` names the commit (the pseudo-version's last part) after its own 4.xx.
  [ "$kind" = weed ] && ldflags+=" -X github.com/seaweedfs/seaweedfs/weed/util/version.COMMIT=${ver##*-}"
  mkdir -p "$(dirname "$out")"
  extra=:
  if [ "$name" = scheduler-plugins ]; then  # its PodGroup CRD, of the same version, goes next to the binary
    extra="cp \"\$(go env GOMODCACHE)/$mod@$ver/manifests/coscheduling/crd.yaml\" '$(dirname "$out")/podgroup-crd.yaml'"
  fi
  if [ "$name" = kueue ]; then  # its CRDs (in one file) and webhook configurations, of the same version
    extra="m=\"\$(go env GOMODCACHE)/$mod@$ver/config/components\" && for f in \"\$m\"/crd/bases/*.yaml;"
    extra+=" do echo ---; cat \"\$f\"; done >'$(dirname "$out")/kueue-crds.yaml'"
    extra+=" && cp -f \"\$m/webhook/manifests.yaml\" '$(dirname "$out")/kueue-webhooks.yaml'"
  fi
  t_tool=$(date +%s)
  run_logged "$CACHE/logs/$name-$ver.log" "building $name" \
    bash -c "cd '$src' && go mod download $mod && go build -mod=mod -tags '$(build_tags "$pkg")' -o '$out.tmp' -ldflags '$ldflags' '$pkg' && $extra && mv '$out.tmp' '$out'"
  built=$((built + 1))
  # A row of make test's timing table (hack/timings.py), nested under the phase that ran this script.
  [ -z "${DDPJOB_TIMINGS:-}" ] || printf '  build/%s\t%d\t0\n' "$name" "$(( $(date +%s) - t_tool ))" >>"$DDPJOB_TIMINGS"
done
say "all $n tools ready in $CACHE/bin ($built built, $((n - built)) cached)"
