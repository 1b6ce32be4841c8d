{#- A misspelt config key (partition for partitions) is an error, not ignored.
    Enabled only when the test asks for it. -#}
{{ config(materialized='incremental', outbox_enabled={'partition': 2},
          enabled=var('mailbox_it_refusals', false)) }}
select 1 as id
