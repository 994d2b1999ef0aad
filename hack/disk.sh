#!/usr/bin/env bash
# `make disk`: where the project's builds and tests keep their bytes between runs, place by place, against a budget
# (issue 44: one `make demo` and one `make test` had left 35 GB of build cache unnoticed). The places: the project
# cache ($DDPJOB_CACHE: venvs, tools, wheelhouses, the nodes' saved images), the project's dockerd (its data root),
# Go's module and build caches, pip's cache. One `du` over all of them, so a file hard-linked from two places (the
# saved node images; the wheelhouse in an image's build context) counts once, under the place du reached first.
# Exit 1 when the total is over DDPJOB_DISK_BUDGET_GB (default 70: a fresh machine's `make demo` + `make test` left
# 66 GB on 2026-12-06, 19 GB of them Go's caches; docs/e2e.md "Disk"), naming what frees the most. --warn: report,
# but exit 0.
# Environment: DDPJOB_CACHE, DDPJOB_DOCKER_ROOT, DDPJOB_DISK_BUDGET_GB.
set -uo pipefail
warn_only=0
[ "${1:-}" = --warn ] && warn_only=1
CACHE=${DDPJOB_CACHE:-$HOME/.cache/ddpjob}
budget=${DDPJOB_DISK_BUDGET_GB:-70}
case $budget in '' | *[!0-9]*) echo "DDPJOB_DISK_BUDGET_GB=$budget: give a whole number of GB, e.g. 70" >&2; exit 2 ;; esac

places=()
add() { [ -e "$1" ] && places+=("$1"); }
if [ -d "$CACHE" ]; then
  for p in "$CACHE"/* "$CACHE"/venvs/*; do
    [ "$p" = "$CACHE/venvs" ] && continue
    add "$p"
  done
fi
add "${DDPJOB_DOCKER_ROOT:-/var/lib/docker}"
if command -v go >/dev/null; then
  add "$(go env GOMODCACHE)"
  add "$(go env GOCACHE)"
fi
add "$HOME/.cache/pip"
[ "${#places[@]}" -gt 0 ] || { echo "[disk] nothing cached yet (no $CACHE)"; exit 0; }

# du prints each argument's size in the order given, a hard-linked file under the first place that holds it.
report=$(du -s --block-size=1K "${places[@]}" 2>/dev/null | sort -rn)
total=$(awk '{ s += $1 } END { printf "%d", (s + 512) / 1024 }' <<<"$report")
echo "[disk] what the project keeps between runs (MB; a file hard-linked from two places counts once):"
# Places under 1 MB (logs, pid files, empty folders) are summed in one line.
awk '($1 + 512) / 1024 >= 1 { printf "  %8d  %s\n", ($1 + 512) / 1024, $2; next } { n++; small += $1 }
     END { if (n) printf "  %8d  (%d more places under 1 MB each)\n", (small + 512) / 1024, n }' <<<"$report"
printf '  %8d  total; budget %d GB (DDPJOB_DISK_BUDGET_GB)\n' "$total" "$budget"
if [ "$total" -gt $(( budget * 1024 )) ]; then
  top=$(head -n 1 <<<"$report" | cut -f2)
  echo "[disk] over the budget by $(( total / 1024 - budget )) GB. The largest: $top. Free: rm -rf $CACHE/venvs/<an old one>" \
    "(the next make venv / make test-compat reinstalls what it needs), docker builder prune (the project's dockerd)," \
    "go clean -modcache, pip cache purge; or raise DDPJOB_DISK_BUDGET_GB." >&2
  [ "$warn_only" = 1 ] || exit 1
fi
exit 0
