"""Outbox maintenance steps (SPEC §4): retention, leases, consumer health, storage alerts."""


def run(plpy):
    return {}
