"""A client that goes away mid-stream cancels the real engine's request, through the gateway.

A long streamed generation (`ignore_eos`, 3,800 tokens: seconds of decoding) runs through a gateway
in front of one real server; as soon as the client has the stream's first event (the engine has
produced its first token), it closes the connection. Asserted, per attempt:

1. **The gateway closes its upstream connection at once.** Within 3 s of the client's close, the
   engine's end of the gateway's connection is no longer established, and it was the gateway that
   closed it (the kernel's state, read with `ss`: `CLOSE-WAIT`/`LAST-ACK` or gone, not the `FIN-WAIT`/
   `TIME-WAIT` of a close by the engine). This does not wait on the engine's event loop. A
   gateway that does not pass a disconnect on keeps reading the stream (the connection stays
   established until the answer ends, then idles in its pool) and fails here.
2. **The engine aborted the request**: its running gauge (`vllm:num_requests_running`,
   `sglang:num_running_reqs`) reads 0 again, and SGLang counts it in
   `sglang:num_aborted_requests_total`; for vLLM (whose client aborts move no metric:
   `vllm:request_success_total{finished_reason="abort"}` stayed at 0, measured) either it generated
   fewer than the 3,800 tokens it was asked for, or its log says `Request <id> aborted.` (the server
   runs with `--enable-log-requests`): its API server saw the disconnect and cancelled the request
   although its engine core had already decoded every token.

Why an attempt may prove nothing, and is then made again (up to 4 in all): on 2 busy cores vLLM's
engine core decodes the tiny model (~1.3 ms a token) faster than its API server processes the outputs,
and the API server's output loop does not yield to its HTTP side while outputs are queued, so a
request can reach the gateway only after the engine has decoded all 3,800 tokens (the whole answer in
one read): the client cannot leave a stream that has already ended. Closing at the first event (the
role chunk) rather than the first content makes that rare. An attempt whose client has the answer's
`[DONE]` together with its first event is not counted; nor is one in which the gateway closed the
connection at once (1. held) but vLLM's API server, starved the same way, noticed only after its
stream had ended: no gateway could have done more; nor one whose first event came after the engine
had decoded every token (later than 3.8 s, all 3,800 generated) and in which the gateway's connection
stayed open: the gateway may have read that answer to its end and pooled the connection before the
client left. Step 1 is asserted in every attempt in which the client left a running stream, so a
gateway that ignores disconnects fails at its first such attempt (with the relay's upstream close
removed, both engines fail at step 1); the test passes only when an attempt shows both.

While the attempts run, vLLM's engine core yields the CPU to its API server
(`EngineServer.compute_yields`: its engine core's and worker's threads at nice 19, restored after):
without it, on a loaded machine most attempts decode to the end before their first event.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from tests.real_engines.rig import aborted, chat, engine_connections, engine_metric, real_pool_config, running
from tests.real_engines.servers import EngineServer
from tests.support import GatewayProcess, wait_until

pytestmark = [
    pytest.mark.processes,
    pytest.mark.timeout(300),
]  # the first test may wait for a server's startup

LONG = 3800  # tokens: with a short prompt, near the 4096 context; seconds of decoding on a CPU
ATTEMPTS = 4
GENERATED = {"vllm": "vllm:generation_tokens_total", "sglang": "sglang:generation_tokens_total"}
VLLM_ABORTED = re.compile(r"Request (\S+) aborted\.")
# Only this test's requests reach the engine's port from this gateway: no probes (but the first),
# no scrapes, so the connections established when the client leaves are the stream's.
QUIET = {
    "upstream": {"health": {"interval_s": 30, "failure_threshold": 2, "open_s": 30}},
    "routing": {"scrape_interval_s": 0},
}


@pytest.fixture(scope="module")
def gateway(real_engine: EngineServer) -> Iterator[GatewayProcess]:
    config = real_pool_config(
        real_engine.engine, [real_engine.base_url], real_engine.served_model_name, **QUIET
    )
    with GatewayProcess(config) as gw:
        yield gw


@dataclass
class Attempt:
    ended_first: bool = False  # the client had the whole answer with its first event
    first_event_s: float = 0.0  # request sent -> the client's first whole event
    finished_first: bool = False  # the engine had decoded the whole answer before the client left
    upstream_closed_s: float | None = None  # client's close -> the gateway's upstream close
    idle_s: float = 0.0  # client's close -> the engine's running gauge read 0
    generated: float = 0.0  # tokens the engine generated for the request
    engine_aborted: bool = False  # the engine's own evidence of the abort (see the docstring)

    def __str__(self) -> str:
        if self.ended_first:
            return "the answer had ended before the client could leave"
        if self.finished_first:
            return (
                f"the engine had decoded all {LONG} tokens before the first event reached the client "
                f"({self.first_event_s:.1f} s)"
            )
        return (
            f"first event after {self.first_event_s:.2f}s, gateway closed upstream after {self.upstream_closed_s}s, "
            f"engine idle after {self.idle_s:.2f}s, "
            f"{self.generated:.0f} tokens generated, engine-side abort: {self.engine_aborted}"
        )


def _vllm_aborts(server: EngineServer) -> int:
    return len(VLLM_ABORTED.findall(server.log_path.read_text(errors="replace")))


def _finished_before_first_event(engine: EngineServer, result: Attempt, generated_before: float) -> bool:
    """Whether the engine had the whole answer decoded before the client's first event: it generated
    all `LONG` tokens, and the first event came later than any engine decodes them (1 ms a token;
    ~1.3 ms measured). The gateway may then have read the answer to its end and pooled the
    connection before the client left: no close to see. A gateway that ignores a disconnect in an
    attempt whose first event came at once is not excused."""
    if result.first_event_s < LONG * 0.001:
        return False
    wait_until(lambda: running(engine) == 0, 30.0, "the running gauge at 0 within 30 s of the close")
    return engine_metric(engine, GENERATED[engine.engine]) - generated_before >= LONG


def _attempt(gateway: GatewayProcess, engine: EngineServer) -> Attempt:
    """One long stream, closed at its first event."""
    wait_until(lambda: running(engine) == 0, 30, "the engine idle before the attempt")
    aborted_before = aborted(engine)
    logged_before = _vllm_aborts(engine) if engine.engine == "vllm" else 0
    generated_before = engine_metric(engine, GENERATED[engine.engine])
    body = chat("Write for a long time.", max_tokens=LONG, ignore_eos=True, stream=True)
    result = Attempt()
    sent = time.monotonic()
    with (
        httpx.Client(base_url=gateway.base_url, timeout=60, trust_env=False) as client,
        client.stream("POST", "/v1/chat/completions", json=body) as response,
    ):
        assert response.status_code == 200
        received = b""
        chunks = response.iter_raw()  # held: a dropped iterator would close the connection at once
        for chunk in chunks:
            received += chunk
            if b"data: {" in received and b"\n\n" in received[received.index(b"data: {") :]:
                break  # a whole event: the engine has produced its first token
        result.ended_first = b"data: [DONE]" in received
        # the engine's end of the gateway's connections while the stream runs (the stream's is one)
        streams = {port for port, state in engine_connections(engine).items() if state == "ESTAB"}
        closed = time.monotonic()
        result.first_event_s = closed - sent
    # leaving the `with` closed the client's connection mid-stream
    if not result.ended_first:
        assert streams, f"no connection from the gateway to the engine during the stream: {received!r}"

        def gateway_closed() -> bool:
            now = engine_connections(engine)
            return any(now.get(port, "gone") in ("CLOSE-WAIT", "LAST-ACK", "gone") for port in streams)

        try:
            wait_until(gateway_closed, 3.0, "the gateway's close of its upstream connection (3 s)")
        except AssertionError:
            if not _finished_before_first_event(engine, result, generated_before):
                raise
            result.finished_first = True
            return result
        result.upstream_closed_s = round(time.monotonic() - closed, 3)
    # a starved vLLM may decode to the end first: up to 3,800 tokens at a few ms each
    wait_until(lambda: running(engine) == 0, 30.0, "the running gauge at 0 within 30 s of the close")
    result.idle_s = time.monotonic() - closed
    if engine.engine == "sglang":
        if not result.ended_first:
            wait_until(lambda: aborted(engine) == aborted_before + 1, 5, "SGLang's abort counter")
            result.engine_aborted = True
        result.generated = engine_metric(engine, GENERATED["sglang"]) - generated_before
    else:
        result.generated = engine_metric(engine, GENERATED["vllm"]) - generated_before
        time.sleep(0.5)  # still the same: nothing is generating any more
        assert engine_metric(engine, GENERATED["vllm"]) - generated_before == result.generated
        logged = _vllm_aborts(engine) > logged_before
        result.engine_aborted = not result.ended_first and (result.generated < LONG or logged)
    return result


def test_client_disconnect_aborts_the_engine_request(
    gateway: GatewayProcess, real_engine: EngineServer
) -> None:
    attempts: list[Attempt] = []
    # vLLM's engine core yields the CPU to its API server (see the module docstring); SGLang's
    # processes are left alone
    with real_engine.compute_yields() as niced:
        if real_engine.compute_comm:
            assert niced, f"no {real_engine.compute_comm}* process in the {real_engine.engine} server's group"
        while len(attempts) < ATTEMPTS:
            attempt = _attempt(gateway, real_engine)
            attempts.append(attempt)
            if attempt.engine_aborted:
                break
    report = "; ".join(f"{i + 1}: {a}" for i, a in enumerate(attempts))
    assert attempts[-1].engine_aborted, f"no attempt showed the engine's abort ({report})"
