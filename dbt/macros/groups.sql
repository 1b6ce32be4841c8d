{#- mailbox_create_consumer_group: make sure a consumer group reads an outbox (idempotent).

    dbt run-operation mailbox_create_consumer_group --args '{name: billing, outbox: orders, auto_offset_reset: earliest}'

    A group that already reads that outbox is left as it is (auto_offset_reset only
    matters when the group is created). A group of that name on another outbox is the
    SPEC's error: consumer group already exists (42710). An unknown outbox: 42704. -#}
{% macro mailbox_create_consumer_group(name, outbox, auto_offset_reset='latest') -%}
    {%- do pg_mailbox._mailbox_run(pg_mailbox.mailbox_create_consumer_group_sql(name, outbox, auto_offset_reset)) -%}
    {%- do log("pg_mailbox: consumer group " ~ name ~ " reads outbox " ~ outbox, info=true) -%}
{%- endmacro %}

{% macro mailbox_create_consumer_group_sql(name, outbox, auto_offset_reset='latest') -%}
    {{ return(adapter.dispatch('mailbox_create_consumer_group_sql', 'pg_mailbox')(name, outbox, auto_offset_reset)) }}
{%- endmacro %}

{% macro default__mailbox_create_consumer_group_sql(name, outbox, auto_offset_reset) -%}
    {{ pg_mailbox._mailbox_fail("mailbox_create_consumer_group", "pg_mailbox runs on PostgreSQL only, not on " ~ target.type) }}
{%- endmacro %}

{% macro postgres__mailbox_create_consumer_group_sql(name, outbox, auto_offset_reset) -%}
    {%- set where = "mailbox_create_consumer_group" -%}
    {%- do pg_mailbox._mailbox_text(where, "name", name) -%}
    {%- do pg_mailbox._mailbox_text(where, "outbox", outbox) -%}
    {%- do pg_mailbox._mailbox_text(where, "auto_offset_reset", auto_offset_reset) -%}
DO $mailbox_dbt$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM mailbox.consumer_group_lag AS g
                    WHERE g.group_name = {{ pg_mailbox._mailbox_literal(name) }}
                      AND g.outbox_name = {{ pg_mailbox._mailbox_literal(outbox) }}) THEN
        PERFORM mailbox.create_consumer_group({{ pg_mailbox._mailbox_literal(name) }},
                                              {{ pg_mailbox._mailbox_literal(outbox) }},
                                              {{ pg_mailbox._mailbox_literal(auto_offset_reset) }});
    END IF;
END
$mailbox_dbt$
{%- endmacro %}
