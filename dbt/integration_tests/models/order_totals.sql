{#- A plain table model, no pg_mailbox config: the post-hook must leave it alone. -#}
{{ config(materialized='table') }}
select customer, sum(amount) as total from {{ ref('orders_captured') }} group by customer
