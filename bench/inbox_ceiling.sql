-- The ceiling of a function API (docs/benchmarks.md, "Inbox"): what any SQL-callable API pays
-- for being a function. A SECURITY DEFINER PL/pgSQL function with a pinned search_path (what
-- the security rules require of pg_mailbox's) that runs only the baseline's own statement on
-- the baseline's table public.plain_inbox. No lookup, check or dispatch: a bound no design of
-- inbox_receive, inbox_claim or inbox_mark_processed can pass. Used by bench/inbox_bench.py,
-- bench/inbox_cpu.py and bench/inbox_receive_pgbench.sh, which make public.plain_inbox first
-- and drop the table and these functions after.
CREATE FUNCTION public.ceiling_receive(p_event_id text)
RETURNS boolean LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    INSERT INTO public.plain_inbox (event_id, payload, event_type)
    VALUES (p_event_id, '{"n": 1}', 'bench') ON CONFLICT (event_id) DO NOTHING;
    RETURN FOUND;
END
$$;
CREATE FUNCTION public.ceiling_mark(p_event_id text)
RETURNS boolean LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    UPDATE public.plain_inbox SET processed_at = now() WHERE event_id = p_event_id;
    RETURN FOUND;
END
$$;

-- The claim: the baseline's SKIP LOCKED statement, its rows returned as a set (inbox_claim
-- returns its messages the same way).
CREATE FUNCTION public.ceiling_claim(p_batch_size int)
RETURNS SETOF public.plain_inbox LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN QUERY SELECT * FROM public.plain_inbox WHERE processed_at IS NULL
                  ORDER BY received_at LIMIT p_batch_size FOR UPDATE SKIP LOCKED;
END
$$;
-- The batch mark: the baseline's one UPDATE per batch; the count, as
-- inbox_mark_processed(text, text[]) returns it.
CREATE FUNCTION public.ceiling_mark_batch(p_event_ids text[])
RETURNS bigint LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_marked bigint;
BEGIN
    UPDATE public.plain_inbox SET processed_at = now() WHERE event_id = ANY (p_event_ids);
    GET DIAGNOSTICS v_marked = ROW_COUNT;
    RETURN v_marked;
END
$$;
