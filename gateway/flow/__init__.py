"""Flow: what the fleet does with the traffic it is given — each request's traffic class, and the
engine comparison recorded from finished requests."""
