"""What every part of the typed DDPJob spec shares: the pydantic model settings (camelCase on the wire, unknown
fields refused, frozen) and the name patterns."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

#: A Kubernetes object name (DNS-1123 subdomain).
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"


class Model(BaseModel):
    """A part of the spec: camelCase aliases, unknown fields refused (a typo is an error, not a silent default)."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        str_strip_whitespace=True,
    )
