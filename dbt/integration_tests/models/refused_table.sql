{#- outbox_enabled on a table model: refused (dbt rebuilds it every run, dropping capture).
    Enabled only when the test asks for it. -#}
{{ config(materialized='table', outbox_enabled=true, enabled=var('mailbox_it_refusals', false)) }}
select 1 as id
