{#- An incremental model adopted as an inbox (inbox_config, here under meta, where dbt 1.10+
    prefers custom keys): new events are appended with processing columns for workers to
    fill; existing rows are never rewritten. -#}
{{ config(
    materialized='incremental',
    incremental_strategy='append',
    indexes=[{'columns': ['event_id'], 'unique': true}],
    meta={'inbox_config': {'max_retries': 2}}
) }}
select e.event_id, e.event_type, e.payload,
       now() as received_at, null::timestamptz as processed_at, 0 as retry_count, null::text as error
  from {{ source('app', 'events') }} as e
{% if is_incremental() %}
 where not exists (select 1 from {{ this }} as t where t.event_id = e.event_id)
{% endif %}
