#!/usr/bin/env bash
# prune-unused.sh KEEP_DAYS CURRENT DIR...: removes each DIR but CURRENT whose `.last-used` file (else its
# `.complete`, else the DIR itself) was last touched KEEP_DAYS or more days ago, saying which. For caches of
# several GB per entry (hack/venv.sh's shared venvs) that a newer entry supersedes but another checkout may still use.
set -uo pipefail
days=$1 current=$2
shift 2
case $days in '' | *[!0-9]*) echo "prune-unused.sh: KEEP_DAYS=$days is not a whole number of days" >&2; exit 2 ;; esac
for dir in "$@"; do
  [ -d "$dir" ] && [ "$dir" != "$current" ] || continue
  mark=$dir/.last-used
  [ -e "$mark" ] || mark=$dir/.complete
  [ -e "$mark" ] || mark=$dir
  # -mtime -N: touched less than N days ago; none printed: N days or more.
  if [ -z "$(find "$mark" -maxdepth 0 -mtime "-$days" 2>/dev/null)" ]; then
    echo "removing $dir (unused for $days days or more)"
    rm -rf "$dir"
  fi
done
