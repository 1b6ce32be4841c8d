"""Inbox maintenance steps (SPEC §4): retention drains, DLQ and ordering-gap alerts."""


def run(plpy):
    return {}
