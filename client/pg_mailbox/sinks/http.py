"""``http://…`` / ``https://…``: ``POST`` of the envelope as JSON, one message at a time
(in order), header ``Idempotency-Key`` = message id.

2xx = delivered, 409 = duplicate (delivered before); 408, 429, 5xx and timeouts are
retried (and count towards --max-attempts); a refused connection is an outage (retried
forever); any other 4xx is poison. Query parameter ``timeout`` (seconds, default 10) is
stripped from the URL.
"""

from __future__ import annotations

from urllib.parse import urlencode, urlunsplit

import httpx

from pg_mailbox.api import dumps
from pg_mailbox.sinks import (
    DELIVERED,
    DUPLICATE,
    Message,
    PoisonMessage,
    Sink,
    SinkError,
    SinkUnavailable,
)

RETRY = {408, 429}


class HttpSink(Sink):
    kind = "http"

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.timeout = float(self.params.pop("timeout", 10))
        p = self.parts
        self.target = urlunsplit((p.scheme, p.netloc, p.path or "/", urlencode(self.params), ""))
        self.client = httpx.AsyncClient(timeout=self.timeout)

    async def start(self) -> None:
        try:
            # any answer means something listens there
            await self.client.request("HEAD", self.target, timeout=5)
        except httpx.TransportError as exc:
            raise SinkUnavailable(f"HTTP endpoint {self.describe()}: {exc!r}") from exc

    async def publish(self, messages: list[Message]) -> list[str]:
        results: list[str] = []
        for i, m in enumerate(messages):
            try:
                r = await self.client.post(
                    self.target,
                    content=dumps(m.envelope).encode(),
                    headers={"Idempotency-Key": m.id, "Content-Type": "application/json"},
                )
            except httpx.TimeoutException as exc:
                raise _partial(
                    SinkError(f"HTTP timeout on {m.id}: {exc!r}", outage=False), results
                ) from exc
            except httpx.TransportError as exc:
                raise _partial(SinkError(f"HTTP endpoint unreachable: {exc!r}"), results) from exc
            code = r.status_code
            if 200 <= code < 300:
                results.append(DELIVERED)
            elif code == 409:
                results.append(DUPLICATE)
            elif code in RETRY or code >= 500:
                raise _partial(SinkError(f"HTTP {code} on {m.id}", outage=False), results)
            else:
                raise PoisonMessage(i, f"HTTP {code}: {r.text[:200]}", results)
        return results

    async def close(self) -> None:
        await self.client.aclose()


def _partial(exc: SinkError, results: list[str]) -> SinkError:
    """Messages before the failing one were acknowledged: the relay resends from there."""
    exc.done = len(results)  # type: ignore[attr-defined]
    return exc
