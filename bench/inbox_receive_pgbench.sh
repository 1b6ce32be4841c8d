#!/usr/bin/env bash
# The single receive from a client, as pgbench sees it: one message per transaction (each
# committed), prepared statements, one connection, against two baselines in the same
# database, interleaved, with synchronous_commit on and off (docs/benchmarks.md, "The single
# receive seen by pgbench"):
#   plain     INSERT ... ON CONFLICT (event_id) DO NOTHING into public.plain_inbox, a table
#             with the inbox table's columns and indexes;
#   ceiling   the same INSERT inside a SECURITY DEFINER PL/pgSQL function with a pinned
#             search_path (what every pg_mailbox function must be), nothing else
#             (bench/inbox_ceiling.sql, as bench/inbox_bench.py's ceiling);
#   receive   mailbox.inbox_receive into a managed inbox.
# Every case makes one round trip per transaction; plain returns no row, the other two one
# boolean. Each case's table is emptied, VACUUM ANALYZEd and CHECKPOINTed before its run
# (outside pgbench's clock, alike for all three; nothing a user pays is done there). The ratio
# is plain's time over the case's (a throughput ratio, as bench/inbox_bench.py prints it),
# the median of the per-round ratios.
#
# usage: bench/inbox_receive_pgbench.sh TRANSACTIONS ROUNDS DB
#   e.g. bench/inbox_receive_pgbench.sh 10000 5 postgres
# env: PGHOST (127.0.0.1), PGUSER (postgres), PGPORT; SYNC: both (default), on or off;
#      PGBENCH: the pgbench to run (default: pg_config --bindir's, else the PATH's).
set -euo pipefail
if [ $# -ne 3 ]; then
    sed -n '2,/^set -euo/s/^# \{0,1\}//p' "$0" >&2
    exit 2
fi
transactions=$1 rounds=$2 db=$3
export PGHOST=${PGHOST:-127.0.0.1} PGUSER=${PGUSER:-postgres}
pgbench=${PGBENCH:-$(command -v "$(pg_config --bindir 2>/dev/null)/pgbench" || command -v pgbench)}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

psql -X -q -v ON_ERROR_STOP=1 -d "$db" >/dev/null <<'SQL'
SET client_min_messages = warning;
SELECT mailbox.drop_inbox('pgb', p_cascade => true, p_if_exists => true);
SELECT mailbox.create_inbox('pgb');
-- (the functions first: ceiling_claim returns the table's rows)
DROP FUNCTION IF EXISTS public.ceiling_receive(text), public.ceiling_mark(text),
    public.ceiling_claim(int), public.ceiling_mark_batch(text[]);
DROP TABLE IF EXISTS public.plain_inbox;
-- the baseline table: the inbox table's columns and indexes (as bench/inbox_server_loops.sql)
CREATE TABLE public.plain_inbox (LIKE mailbox.pgb INCLUDING ALL);
SQL
psql -X -q -v ON_ERROR_STOP=1 -d "$db" -f "$(dirname "$0")/inbox_ceiling.sql" >/dev/null

printf '%s\n' '\set id random(1, 2000000000)' \
    "INSERT INTO public.plain_inbox (event_id, payload, event_type) VALUES (:id, '{\"n\": 1}', 'bench') ON CONFLICT (event_id) DO NOTHING;" \
    >"$work/plain.sql"
printf '%s\n' '\set id random(1, 2000000000)' 'SELECT public.ceiling_receive(:id::text);' >"$work/ceiling.sql"
printf '%s\n' '\set id random(1, 2000000000)' \
    "SELECT mailbox.inbox_receive('pgb', :id::text, '{\"n\": 1}', 'bench');" >"$work/receive.sql"

# usage: one CASE SYNC -> prints the average latency in microseconds
one() {
    local table=public.plain_inbox
    [ "$1" = receive ] && table=mailbox.pgb
    psql -X -q -d "$db" -c "TRUNCATE $table" -c "VACUUM ANALYZE $table" -c "CHECKPOINT"
    PGOPTIONS="-c synchronous_commit=$2" "$pgbench" -n -M prepared -t "$transactions" \
        -f "$work/$1.sql" "$db" 2>&1 \
        | sed -n 's/^latency average = \([0-9.]*\) ms$/\1/p' | awk '{ printf "%.1f", $1 * 1000 }'
}

median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

case ${SYNC:-both} in
    both) modes="on off" ;;
    on | off) modes=$SYNC ;;
    *) echo "SYNC is both, on or off" >&2; exit 2 ;;
esac
cases=(plain ceiling receive)
for sync in $modes; do
    : >"$work/ratios-$sync"
    for round in $(seq 1 "$rounds"); do
        order=("${cases[@]}")
        [ $((round % 2)) = 0 ] && order=(receive ceiling plain)
        line="round $round (synchronous_commit $sync):"
        declare -A took=()
        for c in "${order[@]}"; do
            took[$c]=$(one "$c" "$sync")
            line="$line  $c ${took[$c]} us"
        done
        echo "$line"
        for c in "${cases[@]}"; do echo "$c ${took[$c]}" >>"$work/times-$sync"; done
        echo "ceiling $(awk -v p="${took[plain]}" -v x="${took[ceiling]}" 'BEGIN { printf "%.3f", p / x }')" >>"$work/ratios-$sync"
        echo "receive $(awk -v p="${took[plain]}" -v x="${took[receive]}" 'BEGIN { printf "%.3f", p / x }')" >>"$work/ratios-$sync"
        unset took
    done
    summary="synchronous_commit $sync, medians:"
    for c in "${cases[@]}"; do
        t=$(awk -v c="$c" '$1 == c { print $2 }' "$work/times-$sync" | median)
        summary="$summary  $c $t us"
        if [ "$c" != plain ]; then
            r=$(awk -v c="$c" '$1 == c { print $2 }' "$work/ratios-$sync" | median)
            summary="$summary (ratio $(printf '%.2f' "$r"))"
        fi
    done
    echo "$summary"
done
psql -X -q -d "$db" -c "SET client_min_messages = warning" \
    -c "SELECT mailbox.drop_inbox('pgb', p_cascade => true)" \
    -c "DROP FUNCTION public.ceiling_receive(text), public.ceiling_mark(text)" \
    -c "DROP FUNCTION public.ceiling_claim(int), public.ceiling_mark_batch(text[])" \
    -c "DROP TABLE public.plain_inbox" \
    >/dev/null
