"""Flow: what the fleet does with the traffic it is given — each request's traffic class, the
engine comparison recorded from finished requests, and the opt-in loop that moves pool weight
toward the pools that serve each model better."""
