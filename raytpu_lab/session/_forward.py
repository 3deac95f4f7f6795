"""Attributes of the session that are attributes of one of its services."""

from __future__ import annotations

from typing import Any

__all__ = ["forwarded"]


def forwarded(service: str, name: str, doc: str) -> Any:
    """A read-write property: attribute ``name`` of the object in attribute ``service``."""
    return property(lambda self: getattr(getattr(self, service), name),
                    lambda self, value: setattr(getattr(self, service), name, value), doc=doc)
