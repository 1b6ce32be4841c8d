-- The ceiling of a function API (docs/benchmarks.md, "Inbox"): what any SQL-callable API pays
-- for being a function. A SECURITY DEFINER PL/pgSQL function with a pinned search_path (what
-- the security rules require of pg_mailbox's) that runs only the baseline's own statement on
-- the baseline's table public.plain_inbox. No lookup, check or dispatch: a bound no design of
-- inbox_receive or inbox_mark_processed can pass. Used by bench/inbox_bench.py and
-- bench/inbox_receive_pgbench.sh, which make public.plain_inbox first and drop both after.
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
