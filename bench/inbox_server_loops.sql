-- Server-side loops of inbox claim + mark (docs/benchmarks.md, "Every kind routed ..."):
-- the time a procedure spends per message, with a COMMIT per transaction as a worker's,
-- but no client round trips, so per-call server costs stand out. Run by
-- bench/inbox_server_loops.sh in databases with pg_mailbox installed (one per build).
--
--   CALL bench_fill(n)                  n unread messages in inbox 'clm' and in the baseline
--                                       table public.plain_inbox (same columns and indexes)
--   CALL bench_claim(iters, batch, per_message)
--                                       iters x (inbox_claim(batch), inbox_mark_processed per
--                                       message or once for the batch, COMMIT)
--   CALL bench_plain(iters, batch, per_message)
--                                       the same with SELECT ... FOR UPDATE SKIP LOCKED and
--                                       UPDATE, per message or per batch
--   CALL bench_marks(n, plain)          n x inbox_mark_processed of an unclaimed message of
--                                       'clm' (or, plain, one UPDATE of public.plain_inbox),
--                                       a COMMIT every 10: the mark alone (after bench_fill(n))
--   CALL bench_receive(n, plain)        n x (inbox_receive into inbox 'rcv', or with plain
--                                       INSERT ... ON CONFLICT DO NOTHING into
--                                       public.plain_inbox, COMMIT): new ids, emptied first
--   CALL bench_ordered_fill(n, aggs [, bursts])
--                                       n unread messages in ordered inbox 'ordc' (made
--                                       again), over aggs aggregates, sequences 1, 2, ...,
--                                       received through inbox_receive_batch: the
--                                       aggregates in turn (message g: aggregate g % aggs),
--                                       or with bursts each aggregate's messages together
--   CALL bench_ordered(iters, batch)    iters x (inbox_claim('ordc', batch),
--                                       inbox_mark_processed(text[]), COMMIT); per message
--                                       claimed (a claim takes at most one per aggregate)
-- Each prints NOTICE '<name>: <us> us/msg'. Both sides fetch whole messages.
SET client_min_messages = warning;
SELECT mailbox.create_inbox('clm') WHERE NOT EXISTS (SELECT 1 FROM mailbox._inbox WHERE inbox_name = 'clm');
SELECT mailbox.create_inbox('rcv') WHERE NOT EXISTS (SELECT 1 FROM mailbox._inbox WHERE inbox_name = 'rcv');
DROP TABLE IF EXISTS public.plain_inbox;
CREATE TABLE public.plain_inbox (LIKE mailbox.clm INCLUDING ALL);

CREATE OR REPLACE PROCEDURE bench_fill(n int) LANGUAGE sql AS $$
    TRUNCATE mailbox.clm;
    DELETE FROM mailbox._inbox_lease;
    TRUNCATE public.plain_inbox;
    INSERT INTO mailbox.clm (event_id, payload, event_type)
    SELECT 'c-' || g, jsonb_build_object('n', g), 'bench' FROM generate_series(1, n) AS g;
    INSERT INTO public.plain_inbox (event_id, payload, event_type)
    SELECT 'c-' || g, jsonb_build_object('n', g), 'bench' FROM generate_series(1, n) AS g;
$$;

CREATE OR REPLACE PROCEDURE bench_claim(iters int, batch int, per_message boolean)
LANGUAGE plpgsql AS $$
DECLARE
    ids text[];
    x text;
    t0 timestamptz := clock_timestamp();
BEGIN
    FOR i IN 1 .. iters LOOP
        SELECT array_agg(c.event_id) INTO ids FROM (SELECT * FROM mailbox.inbox_claim('clm', 'w1', batch)) AS c;
        IF per_message THEN
            FOREACH x IN ARRAY ids LOOP
                PERFORM mailbox.inbox_mark_processed('clm', x);
            END LOOP;
        ELSE
            PERFORM mailbox.inbox_mark_processed('clm', ids);
        END IF;
        COMMIT;
    END LOOP;
    RAISE NOTICE 'pg_mailbox: % us/msg',
        round((extract(epoch FROM clock_timestamp() - t0) * 1e6 / (iters * batch))::numeric, 2);
END
$$;

CREATE OR REPLACE PROCEDURE bench_plain(iters int, batch int, per_message boolean)
LANGUAGE plpgsql AS $$
DECLARE
    ids text[];
    x text;
    t0 timestamptz := clock_timestamp();
BEGIN
    FOR i IN 1 .. iters LOOP
        SELECT array_agg(c.event_id) INTO ids
          FROM (SELECT event_id, event_type, source, aggregate_id, sequence_num, priority, payload, headers,
                       trace_id, retry_count, received_at
                  FROM public.plain_inbox WHERE processed_at IS NULL
                 ORDER BY received_at LIMIT batch FOR UPDATE SKIP LOCKED) AS c;
        IF per_message THEN
            FOREACH x IN ARRAY ids LOOP
                UPDATE public.plain_inbox SET processed_at = now() WHERE event_id = x;
            END LOOP;
        ELSE
            UPDATE public.plain_inbox SET processed_at = now() WHERE event_id = ANY (ids);
        END IF;
        COMMIT;
    END LOOP;
    RAISE NOTICE 'baseline: % us/msg',
        round((extract(epoch FROM clock_timestamp() - t0) * 1e6 / (iters * batch))::numeric, 2);
END
$$;

CREATE OR REPLACE PROCEDURE bench_marks(n int, plain boolean)
LANGUAGE plpgsql AS $$
DECLARE
    t0 timestamptz := clock_timestamp();
BEGIN
    FOR i IN 1 .. n LOOP
        IF plain THEN
            UPDATE public.plain_inbox SET processed_at = now() WHERE event_id = 'c-' || i;
        ELSE
            PERFORM mailbox.inbox_mark_processed('clm', 'c-' || i);
        END IF;
        IF i % 10 = 0 THEN
            COMMIT;
        END IF;
    END LOOP;
    RAISE NOTICE '%: % us/msg', CASE WHEN plain THEN 'baseline' ELSE 'pg_mailbox' END,
        round((extract(epoch FROM clock_timestamp() - t0) * 1e6 / n)::numeric, 2);
END
$$;

CREATE OR REPLACE PROCEDURE bench_receive(n int, plain boolean)
LANGUAGE plpgsql AS $$
DECLARE
    t0 timestamptz;
BEGIN
    TRUNCATE mailbox.rcv;
    TRUNCATE public.plain_inbox;
    COMMIT;
    t0 := clock_timestamp();
    IF plain THEN
        FOR i IN 1 .. n LOOP
            INSERT INTO public.plain_inbox (event_id, payload, event_type)
            VALUES ('r-' || i, '{"n": 1}', 'bench') ON CONFLICT (event_id) DO NOTHING;
            COMMIT;
        END LOOP;
    ELSE
        FOR i IN 1 .. n LOOP
            PERFORM mailbox.inbox_receive('rcv', 'r-' || i, '{"n": 1}', 'bench');
            COMMIT;
        END LOOP;
    END IF;
    RAISE NOTICE '%: % us/msg', CASE WHEN plain THEN 'baseline' ELSE 'pg_mailbox' END,
        round((extract(epoch FROM clock_timestamp() - t0) * 1e6 / n)::numeric, 2);
END
$$;

DROP PROCEDURE IF EXISTS bench_ordered_fill(int, int);
CREATE OR REPLACE PROCEDURE bench_ordered_fill(n int, aggs int, bursts boolean DEFAULT false)
LANGUAGE plpgsql AS $$
DECLARE
    per int := greatest(n / aggs, 1);
BEGIN
    PERFORM mailbox.drop_inbox('ordc', true, true)
      FROM mailbox._inbox WHERE inbox_name = 'ordc';
    PERFORM mailbox.create_inbox('ordc');
    PERFORM mailbox.enable_inbox_ordering('ordc');
    FOR b IN 0 .. (n - 1) / 1000 LOOP
        PERFORM mailbox.inbox_receive_batch('ordc', (
            SELECT jsonb_agg(jsonb_build_object('p_event_id', 'o-' || g, 'p_payload', '{"n": 1}'::jsonb,
                                                'p_aggregate_id', 'a-' || CASE WHEN bursts THEN g / per ELSE g % aggs END,
                                                'p_sequence_num', CASE WHEN bursts THEN g % per ELSE g / aggs END + 1))
              FROM generate_series(b * 1000, least(n - 1, b * 1000 + 999)) AS g));
    END LOOP;
END
$$;

CREATE OR REPLACE PROCEDURE bench_ordered(iters int, batch int)
LANGUAGE plpgsql AS $$
DECLARE
    ids text[];
    got bigint := 0;
    t0 timestamptz := clock_timestamp();
BEGIN
    FOR i IN 1 .. iters LOOP
        SELECT array_agg(c.event_id) INTO ids FROM (SELECT * FROM mailbox.inbox_claim('ordc', 'w1', batch)) AS c;
        got := got + coalesce(cardinality(ids), 0);
        PERFORM mailbox.inbox_mark_processed('ordc', ids);
        COMMIT;
    END LOOP;
    RAISE NOTICE 'pg_mailbox ordered: % us/msg (% claimed)',
        round((extract(epoch FROM clock_timestamp() - t0) * 1e6 / greatest(got, 1))::numeric, 2), got;
END
$$;
