"""``stdout:``: the envelope as one JSON object per line (no idempotency key)."""

from __future__ import annotations

import sys

from pg_mailbox.api import dumps
from pg_mailbox.sinks import DELIVERED, Message, Sink, SinkError


class StdoutSink(Sink):
    kind = "stdout"

    async def start(self) -> None:
        self.out = sys.stdout

    async def publish(self, messages: list[Message]) -> list[str]:
        try:
            self.out.write("".join(dumps(m.envelope) + "\n" for m in messages))
            self.out.flush()
        except OSError as exc:  # a closed pipe: nothing was acknowledged
            raise SinkError(f"stdout: {exc}") from exc
        return [DELIVERED] * len(messages)
