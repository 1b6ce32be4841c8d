{#- mailbox_enable_outbox: make sure a table is captured into an outbox (idempotent).

    dbt run-operation mailbox_enable_outbox --args '{relation: analytics.orders}'
    dbt run-operation mailbox_enable_outbox --args '{relation: analytics.orders, outbox_name: orders, partitions: 4}'

    Already captured by that outbox: nothing changes (capture is re-installed if its
    triggers were removed or disabled). The outbox name is outbox_name, else the table's
    name: always explicit, so a run never silently derives another name. -#}
{% macro mailbox_enable_outbox(relation, outbox_name=none, retention_hours=none, inline_threshold_rows=none,
                               initial_snapshot=false, partitions=none) -%}
    {%- set sql = pg_mailbox.mailbox_enable_outbox_sql(relation, outbox_name, retention_hours,
                                                       inline_threshold_rows, initial_snapshot, partitions) -%}
    {%- do pg_mailbox._mailbox_run(sql) -%}
    {%- do log("pg_mailbox: outbox " ~ (outbox_name or (relation | string).split('.')[-1]) ~ " captures " ~ relation, info=true) -%}
{%- endmacro %}

{% macro mailbox_enable_outbox_sql(relation, outbox_name=none, retention_hours=none, inline_threshold_rows=none,
                                   initial_snapshot=false, partitions=none) -%}
    {{ return(adapter.dispatch('mailbox_enable_outbox_sql', 'pg_mailbox')(
        relation, outbox_name, retention_hours, inline_threshold_rows, initial_snapshot, partitions)) }}
{%- endmacro %}

{% macro default__mailbox_enable_outbox_sql(relation, outbox_name, retention_hours, inline_threshold_rows,
                                            initial_snapshot, partitions) -%}
    {{ pg_mailbox._mailbox_fail("mailbox_enable_outbox", "pg_mailbox runs on PostgreSQL only, not on " ~ target.type) }}
{%- endmacro %}

{% macro postgres__mailbox_enable_outbox_sql(relation, outbox_name, retention_hours, inline_threshold_rows,
                                             initial_snapshot, partitions) -%}
    {%- set where = "mailbox_enable_outbox" -%}
    {%- if relation is not defined or relation is none -%}{{ pg_mailbox._mailbox_fail(where, "relation is required (SQLSTATE 22004 in SQL)") }}{%- endif -%}
    {%- set source = (relation.include(database=false) if relation.include is defined else relation) | string -%}
    {%- set name = pg_mailbox._mailbox_text(where, "outbox_name", outbox_name, required=false) -%}
    {%- if name is none -%}
        {#- a relation object has .identifier; a string "schema.table" its last part -#}
        {%- set name = relation.identifier if relation.identifier is defined else source.split('.')[-1] | replace('"', '') -%}
    {%- endif -%}
    {%- do pg_mailbox._mailbox_int(where, "retention_hours", retention_hours) -%}
    {%- do pg_mailbox._mailbox_int(where, "inline_threshold_rows", inline_threshold_rows) -%}
    {%- do pg_mailbox._mailbox_bool(where, "initial_snapshot", initial_snapshot) -%}
    {%- do pg_mailbox._mailbox_int(where, "partitions", partitions) -%}
DO $mailbox_dbt$
DECLARE
    v_rel oid := pg_catalog.to_regclass({{ pg_mailbox._mailbox_literal(source) }});
    v_table text;
    v_name text := {{ pg_mailbox._mailbox_literal(name) }};
    v_row mailbox.outboxes;
BEGIN
    IF v_rel IS NULL THEN
        RAISE EXCEPTION 'table not found: %', {{ pg_mailbox._mailbox_literal(source) }}
            USING ERRCODE = '42704', HINT = 'Pass schema.table of an existing table.';
    END IF;
    SELECT pg_catalog.format('%I.%I', n.nspname, c.relname) INTO v_table
      FROM pg_catalog.pg_class AS c JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
     WHERE c.oid = v_rel;
    -- already captured?
    SELECT * INTO v_row FROM mailbox.outboxes AS o WHERE o.source = v_table;
    IF FOUND THEN
        IF v_row.outbox_name <> v_name THEN
            RAISE EXCEPTION 'table % is captured by outbox %, not %', v_table, v_row.outbox_name, v_name
                USING ERRCODE = '55000',
                      HINT = 'Set outbox_name to ' || v_row.outbox_name || ', or disable that outbox first (mailbox.disable_outbox).';
        END IF;
        IF NOT v_row.enabled THEN
            PERFORM mailbox.repair_outbox_capture(v_name); -- its triggers were removed or disabled
        END IF;
        RETURN;
    END IF;
    -- the outbox exists but captures another table: the model's table was rebuilt
    -- (table materialization, --full-refresh), which drops the capture triggers with it
    SELECT * INTO v_row FROM mailbox.outboxes AS o WHERE o.outbox_name = v_name;
    IF FOUND THEN
        RAISE EXCEPTION 'outbox % captures %, not %', v_name, v_row.source, v_table
            USING ERRCODE = '55000',
                  DETAIL = 'A rebuilt table (table materialization, --full-refresh) is a new table: capture and the outbox''s consumer groups stay with the old one.',
                  HINT = 'Keep the table across runs (materialized=incremental with full_refresh=false), or drop the outbox (mailbox.disable_outbox) to start a new one.';
    END IF;
    PERFORM mailbox.enable_outbox(v_table, p_outbox_name => v_name
        {%- if retention_hours is not none %}, p_retention_hours => {{ retention_hours }}{% endif %}
        {%- if inline_threshold_rows is not none %}, p_inline_threshold_rows => {{ inline_threshold_rows }}{% endif %}
        {%- if initial_snapshot %}, p_initial_snapshot => true{% endif %}
        {%- if partitions is not none %}, p_partitions => {{ partitions }}{% endif %});
END
$mailbox_dbt$
{%- endmacro %}
