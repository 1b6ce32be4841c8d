{#- mailbox_create_inbox: make sure an inbox exists (idempotent).

    dbt run-operation mailbox_create_inbox --args '{name: payments, max_retries: 5}'

    An inbox of that name in that schema is left as it is (settings are not changed). One
    of that name elsewhere, or a plain table in the way: the SPEC's 42710 error. A schema
    a non-superuser owns: 42501 (adopt a model's table with inbox_config instead). -#}
{% macro mailbox_create_inbox(name, schema='mailbox', max_retries=none, retention_hours=none,
                              with_dead_letter=none, with_stats=none) -%}
    {%- do pg_mailbox._mailbox_run(pg_mailbox.mailbox_create_inbox_sql(
        name, schema, max_retries, retention_hours, with_dead_letter, with_stats)) -%}
    {%- do log("pg_mailbox: inbox " ~ schema ~ "." ~ name ~ " exists", info=true) -%}
{%- endmacro %}

{% macro mailbox_create_inbox_sql(name, schema='mailbox', max_retries=none, retention_hours=none,
                                  with_dead_letter=none, with_stats=none) -%}
    {{ return(adapter.dispatch('mailbox_create_inbox_sql', 'pg_mailbox')(
        name, schema, max_retries, retention_hours, with_dead_letter, with_stats)) }}
{%- endmacro %}

{% macro default__mailbox_create_inbox_sql(name, schema, max_retries, retention_hours, with_dead_letter, with_stats) -%}
    {{ pg_mailbox._mailbox_fail("mailbox_create_inbox", "pg_mailbox runs on PostgreSQL only, not on " ~ target.type) }}
{%- endmacro %}

{% macro postgres__mailbox_create_inbox_sql(name, schema, max_retries, retention_hours, with_dead_letter, with_stats) -%}
    {%- set where = "mailbox_create_inbox" -%}
    {%- do pg_mailbox._mailbox_text(where, "name", name) -%}
    {%- do pg_mailbox._mailbox_text(where, "schema", schema) -%}
    {%- do pg_mailbox._mailbox_int(where, "max_retries", max_retries) -%}
    {%- do pg_mailbox._mailbox_int(where, "retention_hours", retention_hours) -%}
    {%- do pg_mailbox._mailbox_bool(where, "with_dead_letter", with_dead_letter) -%}
    {%- do pg_mailbox._mailbox_bool(where, "with_stats", with_stats) -%}
DO $mailbox_dbt$
DECLARE
    v_schema text;
BEGIN
    -- inbox_status of this one inbox (42704 when there is none): never counts the others
    BEGIN
        SELECT s.inbox_schema INTO v_schema FROM mailbox.inbox_status({{ pg_mailbox._mailbox_literal(name) }}) AS s;
    EXCEPTION WHEN undefined_object THEN
        v_schema := NULL;
    END;
    IF v_schema IS NULL THEN
        PERFORM mailbox.create_inbox({{ pg_mailbox._mailbox_literal(name) }}, p_schema => {{ pg_mailbox._mailbox_literal(schema) }}
            {%- if max_retries is not none %}, p_max_retries => {{ max_retries }}{% endif %}
            {%- if with_dead_letter is not none %}, with_dead_letter => {{ with_dead_letter }}{% endif %}
            {%- if with_stats is not none %}, with_stats => {{ with_stats }}{% endif %}
            {%- if retention_hours is not none %}, p_retention_hours => {{ retention_hours }}{% endif %});
    ELSIF v_schema <> {{ pg_mailbox._mailbox_literal(schema) }} THEN
        RAISE EXCEPTION 'inbox already exists: %', {{ pg_mailbox._mailbox_literal(name) }}
            USING ERRCODE = '42710',
                  DETAIL = pg_catalog.format('It is in schema %s, not %s.', v_schema, {{ pg_mailbox._mailbox_literal(schema) }}),
                  HINT = 'Choose another name, or drop it with mailbox.drop_inbox().';
    END IF;
END
$mailbox_dbt$
{%- endmacro %}

{#- mailbox_track_inbox_sql: adopt a model's table as an inbox (the inbox_config model
    config; mailbox.enable_inbox_tracking), idempotent. -#}
{% macro mailbox_track_inbox_sql(relation, name, columns={}, max_retries=none) -%}
    {{ return(adapter.dispatch('mailbox_track_inbox_sql', 'pg_mailbox')(relation, name, columns, max_retries)) }}
{%- endmacro %}

{% macro default__mailbox_track_inbox_sql(relation, name, columns, max_retries) -%}
    {{ pg_mailbox._mailbox_fail("inbox_config", "pg_mailbox runs on PostgreSQL only, not on " ~ target.type) }}
{%- endmacro %}

{% macro postgres__mailbox_track_inbox_sql(relation, name, columns, max_retries) -%}
    {%- set where = "inbox_config of " ~ relation -%}
    {%- do pg_mailbox._mailbox_text(where, "name", name) -%}
    {%- do pg_mailbox._mailbox_int(where, "max_retries", max_retries) -%}
DO $mailbox_dbt$
DECLARE
    v_table text := {{ pg_mailbox._mailbox_literal(relation.include(database=false) | string) }};
    v_schema text;
    v_tname text;
BEGIN
    -- inbox_status of this one inbox (42704 when there is none): never counts the others
    BEGIN
        SELECT s.inbox_schema, s.table_name INTO v_schema, v_tname
          FROM mailbox.inbox_status({{ pg_mailbox._mailbox_literal(name) }}) AS s;
    EXCEPTION WHEN undefined_object THEN
        v_schema := NULL;
    END;
    IF v_schema IS NULL THEN
        PERFORM mailbox.enable_inbox_tracking({{ pg_mailbox._mailbox_literal(name) }}, v_table
            {%- for key, value in columns.items() %}, {{ 'p_' ~ key ~ '_column' }} => {{ pg_mailbox._mailbox_literal(value) }}{% endfor %}
            {%- if max_retries is not none %}, p_max_retries => {{ max_retries }}{% endif %});
    ELSIF pg_catalog.to_regclass(pg_catalog.format('%I.%I', v_schema, v_tname))
          IS DISTINCT FROM pg_catalog.to_regclass(v_table) THEN
        RAISE EXCEPTION 'inbox % tracks %.%, not %', {{ pg_mailbox._mailbox_literal(name) }},
                        v_schema, v_tname, v_table
            USING ERRCODE = '55000',
                  DETAIL = 'A rebuilt table (table materialization, --full-refresh) is a new table.',
                  HINT = 'Keep the table across runs (materialized=incremental), or drop the inbox (mailbox.drop_inbox) first.';
    END IF;
END
$mailbox_dbt$
{%- endmacro %}
