"""The timed loop's order: one typed message from the server to the candidate's process (`time`)
and to the reference's (`calibrate`, the empty loop the server subtracts), so both run the loop
of the same shape. The server makes it from the job's plan (server/timed.py); each child reads
it back with `LoopOrder.from_message`, which refuses a field that is missing or not what it must
be (a broken protocol, never a guess)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

from kernelagent.harness.protocol import ProtocolError


@dataclass(frozen=True)
class LoopOrder:
    calls: int  # timed calls per segment
    warmup_calls: int  # unclocked calls on fresh inputs before the first segment
    keep: int  # output slots kept per segment for the reference's secret comparisons
    segments: int  # the loop runs in this many clocked segments (at least 1)
    budget_bytes: int  # device bytes the harness's fresh input sets and kept outputs may hold
    l2_bytes: int | None  # the device's L2, flushed before every call (None: not known)
    payloads: bool  # kept outputs travel as bytes after each segment's report (no CUDA IPC)

    def __post_init__(self) -> None:
        for name in ("calls", "warmup_calls", "keep", "segments", "budget_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < (1 if name == "segments" else 0):
                raise ProtocolError(f"loop order: {name} must be an int >= {1 if name == 'segments' else 0}, "
                                    f"not {value!r}")
        if self.l2_bytes is not None and (isinstance(self.l2_bytes, bool) or not isinstance(self.l2_bytes, int)
                                          or self.l2_bytes < 0):
            raise ProtocolError(f"loop order: l2_bytes must be an int >= 0 or None, not {self.l2_bytes!r}")
        if not isinstance(self.payloads, bool):
            raise ProtocolError(f"loop order: payloads must be true or false, not {self.payloads!r}")

    def fields(self) -> dict[str, Any]:
        """The message's fields (protocol.send(..., **order.fields()))."""
        return dataclasses.asdict(self)

    @classmethod
    def from_message(cls, message: Mapping[str, Any]) -> "LoopOrder":
        """The order a `time` or `calibrate` message carries; ProtocolError if it is not one."""
        names = [f.name for f in dataclasses.fields(cls)]
        missing = [name for name in names if name not in message]
        if missing:
            raise ProtocolError(f"loop order: {missing[0]} is missing")
        return cls(**{name: message[name] for name in names})
