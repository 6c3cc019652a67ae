"""The error every endpoint of ``hfax serve`` answers a bad request with, in OpenAI's shape."""

from __future__ import annotations

from typing import Any


class APIError(Exception):
    """An error answered as OpenAI answers it: ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(
        self,
        message: str,
        status: int = 400,
        param: str | None = None,
        code: str | None = None,
        kind: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.status, self.param, self.code, self.kind = status, param, code, kind

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": str(self),
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        }
