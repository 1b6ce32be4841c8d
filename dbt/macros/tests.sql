{#- Generic tests. Each returns the failing rows, so `dbt test --store-failures` keeps them. -#}

{#- The group's lag (rows past its offset, numbered first) is at most max_lag.
    models: - name: orders
              data_tests: [{pg_mailbox.mailbox_group_lag_below: {group: billing, max_lag: 1000}}] -#}
{% test mailbox_group_lag_below(model, group, max_lag=0) -%}
    {%- do pg_mailbox._mailbox_text("mailbox_group_lag_below", "group", group) -%}
    {%- do pg_mailbox._mailbox_int("mailbox_group_lag_below", "max_lag", max_lag) -%}
select group_name, max(lag) as lag, {{ max_lag }} as max_lag
  from mailbox.consumer_lag({{ pg_mailbox._mailbox_literal(group) }})
 group by group_name
having max(lag) > {{ max_lag }}
{%- endtest %}

{#- mailbox.inbox_health(inbox) reports one of `allowed` (default: healthy only). The inbox
    defaults to the model's name (a model adopted with inbox_config). -#}
{% test mailbox_inbox_healthy(model, inbox=none, allowed=['healthy']) -%}
    {%- set name = inbox or model.identifier -%}
select h.health ->> 'inbox_name' as inbox_name, h.health ->> 'health_status' as health_status, h.health
  from (select mailbox.inbox_health({{ pg_mailbox._mailbox_literal(name) }}) as health) as h
 where h.health ->> 'health_status' not in ({% for a in allowed %}{{ pg_mailbox._mailbox_literal(a) }}{{ ", " if not loop.last }}{% endfor %})
{%- endtest %}

{#- The inbox has no dead letters. -#}
{% test mailbox_no_dead_letters(model, inbox=none) -%}
    {%- set name = inbox or model.identifier -%}
select s.inbox_name, s.dead_letter_count
  from mailbox.inbox_status({{ pg_mailbox._mailbox_literal(name) }}) as s
 where s.dead_letter_count > 0
{%- endtest %}
