"""Control: what operators do to a running fleet.

The admin REST API (FastAPI, `/admin/*`, `/docs`, `/openapi.json`), the operator's verbs behind it
(weights, backends, drain, reload, audit), and the shared store that persists those overrides and
propagates them to every replica; and the browser console over that API (`/admin/ui`, static files in
`ui/`). It is handed the fleet, the store and a small `ConfigSource`
protocol by the root; it never imports the app.
"""
