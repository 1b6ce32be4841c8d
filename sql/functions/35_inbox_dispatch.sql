-- Part 35 (dispatch): the dynamic calls of an inbox's generated functions, the ELSE arm of
-- every router (part 35, routes): the path of an inbox the routers have no arm for (an
-- adopted table owned by someone other than the extension owner, or any inbox until the
-- routers are rebuilt after a restore). Each parses and plans its one statement per call;
-- the function name comes from the catalog row's key, every value is a bind parameter.

CREATE FUNCTION mailbox._inbox_dispatch_receive(
    mailbox._inbox, text, jsonb, text, text, text, bigint, jsonb, text, int
)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_new boolean;
BEGIN
    EXECUTE pg_catalog.format('SELECT mailbox.%I($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)',
                              '_inbox_' || ($1).inbox_key || '_receive')
        INTO v_new
        USING $1, $2, $3, $4, $5, $6, $7, $8, $9, $10;
    RETURN v_new;
END
$$;

CREATE FUNCTION mailbox._inbox_dispatch_claim(mailbox._inbox, int, timestamptz, boolean)
RETURNS mailbox._inbox_message[]
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_rows mailbox._inbox_message[];
BEGIN
    EXECUTE pg_catalog.format('SELECT mailbox.%I($1, $2, $3, $4)', '_inbox_' || ($1).inbox_key || '_claim')
        INTO v_rows
        USING $1, $2, $3, $4;
    RETURN v_rows;
END
$$;

CREATE FUNCTION mailbox._inbox_dispatch_processed(mailbox._inbox, text)
RETURNS mailbox._inbox_done
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_done mailbox._inbox_done;
BEGIN
    EXECUTE pg_catalog.format('SELECT * FROM mailbox.%I($1, $2)', '_inbox_' || ($1).inbox_key || '_processed')
        INTO v_done
        USING $1, $2;
    RETURN v_done;
END
$$;

CREATE FUNCTION mailbox._inbox_dispatch_failed(mailbox._inbox, text, text)
RETURNS mailbox._inbox_attempt
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_attempt mailbox._inbox_attempt;
BEGIN
    EXECUTE pg_catalog.format('SELECT * FROM mailbox.%I($1, $2, $3)', '_inbox_' || ($1).inbox_key || '_failed')
        INTO v_attempt
        USING $1, $2, $3;
    RETURN v_attempt;
END
$$;

CREATE FUNCTION mailbox._inbox_dispatch_receive_batch(mailbox._inbox, jsonb)
RETURNS boolean[]
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_new boolean[];
BEGIN
    EXECUTE pg_catalog.format('SELECT mailbox.%I($1, $2)', '_inbox_' || ($1).inbox_key || '_receive_batch')
        INTO v_new
        USING $1, $2;
    RETURN v_new;
END
$$;

CREATE FUNCTION mailbox._inbox_dispatch_processed_batch(mailbox._inbox, text[])
RETURNS mailbox._inbox_done[]
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_done mailbox._inbox_done[];
BEGIN
    EXECUTE pg_catalog.format('SELECT mailbox.%I($1, $2)', '_inbox_' || ($1).inbox_key || '_processed_batch')
        INTO v_done
        USING $1, $2;
    RETURN v_done;
END
$$;

CREATE FUNCTION mailbox._inbox_dispatch_processed_count(mailbox._inbox, text[])
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_count bigint;
BEGIN
    EXECUTE pg_catalog.format('SELECT mailbox.%I($1, $2)', '_inbox_' || ($1).inbox_key || '_processed_count')
        INTO v_count
        USING $1, $2;
    RETURN v_count;
END
$$;

CREATE FUNCTION mailbox._inbox_dispatch_unsettled(mailbox._inbox, text[])
RETURNS text[]
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_left text[];
BEGIN
    EXECUTE pg_catalog.format('SELECT mailbox.%I($1, $2)', '_inbox_' || ($1).inbox_key || '_unsettled')
        INTO v_left
        USING $1, $2;
    RETURN v_left;
END
$$;
