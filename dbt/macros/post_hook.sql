{#- mailbox_post_hook: applies a model's pg_mailbox configs after dbt builds it.
    Add it once, for all models, in your dbt_project.yml:

        models:
          +post-hook: "{{ pg_mailbox.mailbox_post_hook() }}"

    Model configs (config(...), dbt_project.yml `+key`, or the same keys under meta):
      outbox_enabled: true | {outbox_name, retention_hours, inline_threshold_rows,
                              initial_snapshot, partitions}
      consumer_group: name | {name, outbox, auto_offset_reset} | a list of those
      inbox_config:   {name, max_retries, columns: {id: ..., processed_at: ..., ...}}

    A model without any of them gets an empty hook. Capture and adoption need a table that
    outlives the run: `table`, `view`, `materialized_view` and `ephemeral` models are
    refused (docs/dbt.md), and a rebuilt table (--full-refresh) fails the model, rolling the
    rebuild back, instead of losing capture silently. -#}
{% macro mailbox_post_hook() -%}
    {{ return(adapter.dispatch('mailbox_post_hook', 'pg_mailbox')()) }}
{%- endmacro %}

{% macro default__mailbox_post_hook() -%}
    {%- if pg_mailbox._mailbox_config('outbox_enabled') or pg_mailbox._mailbox_config('consumer_group')
          or pg_mailbox._mailbox_config('inbox_config') -%}
        {{ pg_mailbox._mailbox_fail("mailbox_post_hook", "pg_mailbox runs on PostgreSQL only, not on " ~ target.type) }}
    {%- endif -%}
{%- endmacro %}

{% macro postgres__mailbox_post_hook() -%}
    {%- set outbox_cfg = pg_mailbox._mailbox_config('outbox_enabled') -%}
    {%- set group_cfg = pg_mailbox._mailbox_config('consumer_group') -%}
    {%- set inbox_cfg = pg_mailbox._mailbox_config('inbox_config') -%}
    {%- if not (outbox_cfg or group_cfg or inbox_cfg) -%}{{ return("") }}{%- endif -%}
    {%- set where = "model " ~ this -%}
    {%- set materialized = config.get('materialized') -%}
    {%- set statements = [] -%}
    {%- set outbox_name = none -%}

    {%- if (outbox_cfg or inbox_cfg) and materialized in ['table', 'view', 'materialized_view', 'ephemeral'] -%}
        {{ pg_mailbox._mailbox_fail(where, (("outbox_enabled" if outbox_cfg else "inbox_config"))
            ~ " needs a table that outlives the run, but the model is materialized as '" ~ materialized ~ "'"
            ~ (": dbt rebuilds a table model every run, which drops capture with the old table" if materialized == 'table' else "")
            ~ ". Use materialized='incremental' (with full_refresh=false). See docs/dbt.md.") }}
    {%- endif -%}

    {%- if outbox_cfg -%}
        {%- if outbox_cfg is sameas true -%}{%- set outbox_cfg = {} -%}
        {%- elif outbox_cfg is not mapping -%}
            {{ pg_mailbox._mailbox_fail(where, "outbox_enabled must be true or a mapping, got " ~ outbox_cfg) }}
        {%- endif -%}
        {%- do pg_mailbox._mailbox_known_keys(where ~ " outbox_enabled", outbox_cfg,
               ['outbox_name', 'retention_hours', 'inline_threshold_rows', 'initial_snapshot', 'partitions']) -%}
        {%- set outbox_name = outbox_cfg.get('outbox_name') or this.identifier -%}
        {%- do statements.append(pg_mailbox.mailbox_enable_outbox_sql(this, outbox_name,
               outbox_cfg.get('retention_hours'), outbox_cfg.get('inline_threshold_rows'),
               outbox_cfg.get('initial_snapshot', false), outbox_cfg.get('partitions'))) -%}
    {%- endif -%}

    {%- if group_cfg -%}
        {%- set groups = group_cfg if (group_cfg is iterable and group_cfg is not string and group_cfg is not mapping) else [group_cfg] -%}
        {%- for group in groups -%}
            {%- if group is string -%}{%- set group = {'name': group} -%}{%- endif -%}
            {%- if group is not mapping -%}
                {{ pg_mailbox._mailbox_fail(where, "consumer_group must be a name, a mapping or a list of those, got " ~ group) }}
            {%- endif -%}
            {%- do pg_mailbox._mailbox_known_keys(where ~ " consumer_group", group, ['name', 'outbox', 'auto_offset_reset']) -%}
            {%- set group_outbox = group.get('outbox') or outbox_name -%}
            {%- if group_outbox is none -%}
                {{ pg_mailbox._mailbox_fail(where, "consumer_group " ~ group.get('name') ~ " needs outbox: the model has no outbox_enabled") }}
            {%- endif -%}
            {%- do statements.append(pg_mailbox.mailbox_create_consumer_group_sql(
                   group.get('name'), group_outbox, group.get('auto_offset_reset', 'latest'))) -%}
        {%- endfor -%}
    {%- endif -%}

    {%- if inbox_cfg -%}
        {%- if inbox_cfg is sameas true -%}{%- set inbox_cfg = {} -%}
        {%- elif inbox_cfg is not mapping -%}
            {{ pg_mailbox._mailbox_fail(where, "inbox_config must be true or a mapping, got " ~ inbox_cfg) }}
        {%- endif -%}
        {%- do pg_mailbox._mailbox_known_keys(where ~ " inbox_config", inbox_cfg, ['name', 'max_retries', 'columns']) -%}
        {%- set columns = inbox_cfg.get('columns') or {} -%}
        {%- do pg_mailbox._mailbox_known_keys(where ~ " inbox_config.columns", columns,
               ['id', 'processed_at', 'retry_count', 'error', 'received_at', 'event_type', 'payload']) -%}
        {%- do statements.append(pg_mailbox.mailbox_track_inbox_sql(this, inbox_cfg.get('name') or this.identifier,
               columns, inbox_cfg.get('max_retries'))) -%}
    {%- endif -%}

    {{ return(statements | join(";\n")) }}
{%- endmacro %}
