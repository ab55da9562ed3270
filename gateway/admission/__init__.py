"""Admission: who may call (JWT, JWKS, API keys), with what (intake, validation, the sanitiser) and how
much (limits in this process or in Redis), as pipeline stages that `Admission` assembles from settings.

The interface other wings may use (docs/architecture.md): `Admission` for the root, and the API-key
registry the control wing's admin API manages.
"""

from gateway.admission.api_keys import ApiKeyRecord, ApiKeys, ApiKeySpec
from gateway.admission.assembly import Admission

__all__ = ["Admission", "ApiKeyRecord", "ApiKeySpec", "ApiKeys"]
