"""Routing: the stage that asks the pure router (`policies/`) for a pool and a backend, builds that
router from the settings, and explains a decision for the admin API."""
