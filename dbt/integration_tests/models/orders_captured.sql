{#- Captured incremental model: every batch dbt appends becomes one outbox row, which the
    consumer group it_billing (created with the model) reads from the start. -#}
{{ config(
    materialized='incremental',
    full_refresh=(none if var('mailbox_it_allow_full_refresh', false) else false),
    outbox_enabled={'partitions': 2},
    consumer_group=[{'name': 'it_billing', 'auto_offset_reset': 'earliest'},
                    {'name': 'it_audit', 'auto_offset_reset': 'earliest'}]
) }}
select id, customer, amount
  from {{ source('app', 'orders') }}
{% if is_incremental() %}
 where id > (select coalesce(max(id), 0) from {{ this }})
{% endif %}
