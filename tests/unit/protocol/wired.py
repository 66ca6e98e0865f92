"""Action results as the wire carries them, for the tests of what reads a result's JSON (the reply, the
dialects' and the vendors' forms): they read only its ``wire()``, so a test may hand any JSON, a
partial one included, without building the sandbox's result model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from corral.protocol.plan import ActionResult, EncodedImage


@dataclass(frozen=True)
class Wired:
    data: dict[str, Any]

    def wire(self) -> dict[str, Any]:
        return self.data


def result_of(data: dict[str, Any], image: EncodedImage | None = None) -> ActionResult:
    return ActionResult(Wired(data), image)  # type: ignore[arg-type]
