"""The ground floor: what every wing may use and nothing here may outgrow.

Shared types — the request's context and principal, the ASGI response objects, the fleet's live state
(pools, backends, circuits, the operator's overrides), the settings types several wings read — and
shared plumbing: the Redis connection (client and auto-pipelining wire), background-task helpers, the
client-disconnect watch. Modules here import only each other (and `engines`, `policies`).
"""
