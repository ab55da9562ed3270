"""Observability: the gateway's Prometheus metrics (families, exposition, multiprocess files, the fleet
gauges' sampler) and the JSON access log, with their settings."""
