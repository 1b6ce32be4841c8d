{#- Internal helpers of the pg_mailbox dbt package: SQL literals built from Jinja values,
    argument checks that name the argument, and reading the model configs. -#}

{#- A SQL literal for a Jinja value: NULL, true/false, a number, or a quoted string
    (standard_conforming_strings: doubling the quote is the whole escaping). -#}
{% macro _mailbox_literal(value) -%}
    {%- if value is none -%}NULL
    {%- elif value is sameas true -%}true
    {%- elif value is sameas false -%}false
    {%- elif value is number -%}{{ value }}
    {%- elif '$mailbox_dbt$' in (value | string) -%}
        {{ pg_mailbox._mailbox_fail("argument", "a value may not contain $mailbox_dbt$ (SQLSTATE 22023 in SQL)") }}
    {%- else -%}'{{ value | string | replace("'", "''") }}'
    {%- endif -%}
{%- endmacro %}

{% macro _mailbox_fail(where, message) -%}
    {{ exceptions.raise_compiler_error("pg_mailbox: " ~ where ~ ": " ~ message) }}
{%- endmacro %}

{#- Required text argument: present and a string. -#}
{% macro _mailbox_text(where, name, value, required=true) -%}
    {%- if value is not defined or value is none -%}
        {%- if required -%}{{ pg_mailbox._mailbox_fail(where, name ~ " is required (SQLSTATE 22004 in SQL)") }}{%- endif -%}
    {%- elif value is not string -%}
        {{ pg_mailbox._mailbox_fail(where, name ~ " must be text, got " ~ (value | string) ~ " (SQLSTATE 22023 in SQL)") }}
    {%- endif -%}
    {{ return(value) }}
{%- endmacro %}

{#- Optional integer argument: none or a whole number (not a boolean, not a string). -#}
{% macro _mailbox_int(where, name, value) -%}
    {%- if value is not none and (value is sameas true or value is sameas false or value is not number or (value | int) != value) -%}
        {{ pg_mailbox._mailbox_fail(where, name ~ " must be a whole number, got " ~ (value | string) ~ " (SQLSTATE 22023 in SQL)") }}
    {%- endif -%}
    {{ return(value) }}
{%- endmacro %}

{% macro _mailbox_bool(where, name, value) -%}
    {%- if value is not none and not (value is sameas true or value is sameas false) -%}
        {{ pg_mailbox._mailbox_fail(where, name ~ " must be true or false, got " ~ (value | string) ~ " (SQLSTATE 22023 in SQL)") }}
    {%- endif -%}
    {{ return(value) }}
{%- endmacro %}

{#- Only these keys may appear in a config mapping: a typo must not be ignored. -#}
{% macro _mailbox_known_keys(where, mapping, allowed) -%}
    {%- for key in mapping -%}
        {%- if key not in allowed -%}
            {{ pg_mailbox._mailbox_fail(where, "unknown key " ~ key ~ " (allowed: " ~ (allowed | join(", ")) ~ ")") }}
        {%- endif -%}
    {%- endfor -%}
{%- endmacro %}

{#- A model config value: config(...) / dbt_project.yml `+key`, or the same key under meta
    (dbt 1.10+ prefers custom configs under meta). -#}
{% macro _mailbox_config(key) -%}
    {#- meta first: config.get() of a key that sits under meta makes dbt 1.10+ warn -#}
    {%- set meta = config.get('meta') or {} -%}
    {%- if key in meta -%}{{ return(meta[key]) }}{%- endif -%}
    {{ return(config.get(key)) }}
{%- endmacro %}

{#- Running a macro's SQL from a run-operation. It is one statement (a DO block), so it is
    all or nothing; dbt-postgres runs it outside an explicit transaction, so it is committed
    when dbt prints success (tests/release/test_dbt.py checks from another session). -#}
{% macro _mailbox_run(sql) -%}
    {%- if execute -%}
        {%- do run_query(sql) -%}
    {%- endif -%}
{%- endmacro %}
