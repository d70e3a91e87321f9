#!/bin/sh
# Ask the node-local gossamer before a unit of work, from a shell, with curl.
#
#   examples/check.sh RULE KEY [COST]        e.g. examples/check.sh free tenant-42
#
# Exit 0 once admitted (after waiting out any 429 for the body's retry_after_ms), 1 if the
# cost can never be admitted ("retry_after_ms":null, "outcome":"never"), 2 if gossamer is
# unreachable or refuses the request (the caller decides whether to fail open or closed).
# The wait is the body's milliseconds, not the whole-second Retry-After header (which turns a
# 10/s rule's 100 ms into 1 s); `sleep` takes fractions of a second in GNU coreutils and
# busybox. GOSSAMER_URL defaults to http://127.0.0.1:7070; MAX_TRIES (default 10) bounds the
# waits.
set -u
rule=${1:?usage: check.sh RULE KEY [COST]}
key=${2:?usage: check.sh RULE KEY [COST]}
cost=${3:-1}
url=${GOSSAMER_URL:-http://127.0.0.1:7070}
tries=0
body=$(mktemp)
trap 'rm -f "$body"' EXIT

while :; do
    code=$(curl -s --max-time 1 -o "$body" -w '%{http_code}' \
        -H 'Content-Type: application/json' \
        -d "{\"rule\":\"$rule\",\"key\":\"$key\",\"cost\":$cost}" "$url/v1/check") || code=000
    case "$code" in
        200)
            echo "admitted: $(cat "$body")"
            exit 0
            ;;
        429)
            ms=$(sed -n 's/.*"retry_after_ms":\([0-9][0-9]*\).*/\1/p' "$body")
            if [ -z "$ms" ]; then
                echo "never admitted: $(cat "$body")" >&2
                exit 1
            fi
            tries=$((tries + 1))
            if [ "$tries" -ge "${MAX_TRIES:-10}" ]; then
                echo "still limited after $tries tries" >&2
                exit 2
            fi
            wait=$(awk -v ms="$ms" 'BEGIN { printf "%.3f", ms / 1000 }')
            echo "limited: waiting ${wait}s (retry_after_ms $ms)" >&2
            sleep "$wait"
            ;;
        *)
            echo "gossamer unavailable or refused (HTTP $code): $(cat "$body" 2>/dev/null)" >&2
            exit 2
            ;;
    esac
done
