#!/usr/bin/env bash
# Interleaved rounds of the server-side inbox loops (bench/inbox_server_loops.sql) in one or
# more databases, e.g. one per build to compare (docs/benchmarks.md shows how two builds were
# installed side by side), alternating which database goes first. Before each run the tables
# are refilled, VACUUM ANALYZEd and CHECKPOINTed.
#
# usage: bench/inbox_server_loops.sh ITERS BATCH per_message|batch|marks|receive|ordered ROUNDS DB [DB ...]
#   e.g. bench/inbox_server_loops.sh 1000 10 per_message 7 profold prof
#   (marks: ITERS x BATCH marks of unclaimed messages, a commit every 10, no claims;
#    receive: ITERS single-message receives, each committed; BATCH is ignored;
#    ordered: ITERS claims of BATCH + a batch mark on an ordered inbox holding ITERS x BATCH
#    messages over AGGS aggregates, env, default 1000, received in turn or, with env
#    BURSTS=1, each aggregate's messages together; no baseline)
# env: PGHOST (127.0.0.1), PGUSER (postgres); BASELINE=1 runs the plain-SQL baseline
#   (bench_plain, bench_marks with plain UPDATEs, or bench_receive with plain INSERTs)
#   instead of pg_mailbox's calls.
set -euo pipefail
if [ $# -lt 5 ]; then
    sed -n 's/^# \{0,1\}//p' "$0" | sed -n '2,17p' >&2
    exit 2
fi
iters=$1 batch=$2 mode=$3 rounds=$4
shift 4
dbs=("$@")
here="$(cd "$(dirname "$0")" && pwd)"
per_message=$([ "$mode" = per_message ] && echo true || echo false)
proc=$([ "${BASELINE:-0}" = 1 ] && echo bench_plain || echo bench_claim)
export PGHOST=${PGHOST:-127.0.0.1} PGUSER=${PGUSER:-postgres}
for db in "${dbs[@]}"; do
    psql -X -q -v ON_ERROR_STOP=1 -d "$db" -f "$here/inbox_server_loops.sql" >/dev/null
done
for round in $(seq 1 "$rounds"); do
    order=("${dbs[@]}")
    if [ $((round % 2)) = 0 ]; then
        order=()
        for ((i = ${#dbs[@]} - 1; i >= 0; i--)); do order+=("${dbs[$i]}"); done
    fi
    line="round $round:"
    for db in "${order[@]}"; do
        psql -X -q -d "$db" -c "CALL bench_fill($((iters * batch)))" -c "VACUUM ANALYZE mailbox.clm" \
            -c "VACUUM ANALYZE public.plain_inbox" -c "VACUUM mailbox._inbox_open_claim" -c "CHECKPOINT"
        call="CALL $proc($iters, $batch, $per_message)"
        if [ "$mode" = ordered ]; then
            psql -X -q -d "$db" -c "CALL bench_ordered_fill($((iters * batch)), ${AGGS:-1000}, ${BURSTS:-0} = 1)" \
                -c "VACUUM ANALYZE mailbox.ordc" -c "CHECKPOINT"
            call="CALL bench_ordered($iters, $batch)"
        fi
        if [ "$mode" = marks ]; then
            call="CALL bench_marks($((iters * batch)), $([ "${BASELINE:-0}" = 1 ] && echo true || echo false))"
        fi
        if [ "$mode" = receive ]; then
            call="CALL bench_receive($iters, $([ "${BASELINE:-0}" = 1 ] && echo true || echo false))"
        fi
        took=$(psql -X -q -d "$db" -c "SET synchronous_commit = off" -c "$call" 2>&1 | grep -o '[0-9.]* us/msg')
        line="$line  $db $took"
    done
    echo "$line"
done
