import json

from mailbox_server import errors


def test_envelope_result(plpy):
    assert json.loads(errors.envelope(plpy, lambda p, x: {"x": x}, 3)) == {"result": {"x": 3}}


def test_envelope_mailbox_error(plpy):
    def boom(p):
        raise errors.MailboxError("42704", "outbox not found: x", hint="h")

    assert json.loads(errors.envelope(plpy, boom)) == {
        "error": {
            "sqlstate": "42704",
            "message": "outbox not found: x",
            "detail": None,
            "hint": "h",
        }
    }


def test_envelope_keeps_spi_error_fields(plpy):
    def boom(p):
        raise plpy.SPIError("invalid value for setting mailbox.x: 0", "22023", "d", "h")

    got = json.loads(errors.envelope(plpy, boom))["error"]
    assert got == {
        "sqlstate": "22023",
        "message": "invalid value for setting mailbox.x: 0",
        "detail": "d",
        "hint": "h",
    }
