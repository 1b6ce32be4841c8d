{#- Plain schema names (it, not analytics_it), so the tests know where models live. -#}
{% macro generate_schema_name(custom_schema_name, node) -%}
    {{ custom_schema_name or target.schema }}
{%- endmacro %}
