"""Flow: what the fleet does with the traffic it is given - each request's priority class and, at
saturation, a queue in the gateway instead of the engines' (docs/flow-control.md); each request's
traffic class, the engine comparison recorded from finished requests, and the opt-in loop that
moves pool weight toward the pools that serve each model better.

    settings.py   the `flow` section: classes, tenant weights
    classes.py    a request's class and deadline (principal, `x-gateway-priority`, `service_tier`)
    pressure.py   whether a request's backends are saturated, and their predicted time to first token
    gate.py       the process's queue: waiting, release, deadlines, shedding, the shared view
    stage.py      the pipeline stage between admit and route, and the operators' reports
    traffic.py    a request's traffic class (tools, long prompt, shared preamble, reasoning, plain)
    compare.py    the engine comparison per model, pool and traffic class
    rebalance.py  the opt-in loop that moves pool weight (`routing.rebalance`)

The root builds one `FlowStage` (`build_flow`) and wires it: the proxy's lease watch (`Gate`), the
shared routing state's figures (waiting requests by class), admission's class of a tier or tenant.
"""

from gateway.core.fleet import Fleet
from gateway.flow.classes import Classes, ScopeClass
from gateway.flow.gate import Gate
from gateway.flow.pressure import Pressure
from gateway.flow.settings import FlowSettings
from gateway.flow.stage import FlowStage, TtftObserver


def build_flow(
    settings: FlowSettings,
    fleet: Fleet,
    scrape_stale_s: float,
    scope_class: ScopeClass,
    observer: TtftObserver,
) -> FlowStage:
    """The flow stage with its classes, pressure view and queue."""
    classes = Classes(settings, scope_class)
    pressure = Pressure(fleet, scrape_stale_s)
    gate = Gate(classes.by_name, pressure, observer, settings.tenant_weights)
    return FlowStage(settings, classes, pressure, gate, observer)


__all__ = ["Classes", "FlowSettings", "FlowStage", "Gate", "Pressure", "build_flow"]
