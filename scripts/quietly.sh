# Sourced by scripts/setup.sh and scripts/python_env.sh: `quietly LOG command...` appends the command's
# output (pip's warnings and progress, apt's, ninja's) to LOG instead of the terminal; if the command
# fails, the part of LOG that says why goes to stderr (from the first "FAILED:" or "ERROR:" line, else
# the last 40 lines) with LOG's name, and the command's status is returned.
quietly() {
  local log=$1 start status=0
  shift
  mkdir -p "$(dirname "$log")"
  start=1
  [ ! -f "$log" ] || start=$(($(wc -l <"$log") + 1))
  "$@" >>"$log" 2>&1 || status=$?
  if [ "$status" != 0 ]; then
    tail -n "+$start" "$log" | awk '/^(FAILED:|ERROR:|E: )/ { found = 1 } found' | head -n 150 >"$log.why" || true
    [ -s "$log.why" ] || tail -n "+$start" "$log" | tail -n 40 >"$log.why"
    cat "$log.why" >&2
    rm -f "$log.why"
    echo "kvq: '$*' failed (status $status); its whole output: $log" >&2
  fi
  return "$status"
}
