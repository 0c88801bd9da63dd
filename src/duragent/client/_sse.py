"""Server-sent events read line by line (the WHATWG rules the API's streams use)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class SseEvent:
    event: str
    data: str
    id: str | None


@dataclass(slots=True)
class SseDecoder:
    """Feed it lines (without their line ends); it returns each event as it completes.
    `retry_ms` is the last reconnection delay the server asked for."""

    retry_ms: int | None = None
    _event: str = ""
    _data: list[str] = field(default_factory=list)
    _id: str | None = None

    def feed(self, line: str) -> SseEvent | None:
        if not line:  # a blank line ends the event
            if not self._data:
                self._event, self._id = "", None
                return None
            done = SseEvent(self._event or "message", "\n".join(self._data), self._id)
            self._event, self._data, self._id = "", [], None
            return done
        if line.startswith(":"):  # a comment (keep-alive)
            return None
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        elif name == "id" and "\0" not in value:
            self._id = value
        elif name == "retry" and value.isdigit():
            self.retry_ms = int(value)
        return None
