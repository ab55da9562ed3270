"""Replay a timed trace against one router, in its own process: open-loop arrivals, ordered sessions.

    python -m bench.tracerunner --url URL [--url URL ...] --trace FILE [--header K:V] [--timeout S]

With several `--url`s (the replicas of one router behind no load balancer of their own) the requests
are spread over them round robin, request by request in trace order: a conversation's turns land on
different replicas, as behind a load balancer without session stickiness.

The trace is JSON lines `{"t": seconds, "session": id|null, "body": {...}}`, optionally with its own
`"headers"` (added to the common ones) and `"give_up"` (seconds after sending: a client that has
neither its first token nor a refusal by then disconnects, and the record says `gave_up`). Each
request is sent at its time `t`, except that a session's turn waits for that session's previous turn
to end (a client cannot send turn k+1 before it has turn k's answer). Every request streams; the time
to first token is the time to the first SSE event (the simulators send the role chunk only after
prefill). Prints one JSON line: per request its scheduled and actual send offset, TTFT, total time, the gaps between its
token events (`itl`) and their count (`tokens`), its usage (`[prompt, completion, cached]`, when the
stream ends with a usage chunk), status, our gateway's `x-gateway-route`, `retry-after` and
`x-gateway-queue-ms` (when it answers them) and a refusal's error code; plus this process's CPU
seconds. bench/serving.py turns these into the serving figures.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import resource
import time
from typing import Any

import aiohttp
import orjson
import uvloop

#: answer headers kept in a request's record, by the record's key
ANSWER_HEADERS = {"x-gateway-route": "route", "retry-after": "retry_after", "x-gateway-queue-ms": "queue_ms"}


def error_code(body: bytes) -> str | None:
    """An OpenAI-shaped error body's `error.code` (else its `type`); None when it has neither."""
    try:
        err = orjson.loads(body).get("error")
    except (orjson.JSONDecodeError, AttributeError):
        return None
    if not isinstance(err, dict):
        return None
    code = err.get("code") or err.get("type")
    return str(code) if code is not None else None


class EventClock:
    """Reads an SSE stream's bytes as they arrive: when each token event came (a chunk whose delta
    carries content, reasoning or a tool call) and the usage chunk's figures."""

    def __init__(self) -> None:
        self.arrivals: list[float] = []
        self.usage: list[int] | None = None
        self._pending = b""

    def feed(self, data: bytes, now: float) -> None:
        self._pending += data
        *events, self._pending = self._pending.split(b"\n\n")
        for event in events:
            self._event(event.strip(), now)

    def _event(self, event: bytes, now: float) -> None:
        if not event.startswith(b"data:") or event.endswith(b"[DONE]"):
            return
        try:
            chunk = orjson.loads(event[5:])
        except orjson.JSONDecodeError:
            return
        if not isinstance(chunk, dict):
            return
        if usage := chunk.get("usage"):
            cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
            self.usage = [usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0), cached]
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            if delta.get("content") or delta.get("reasoning_content") or delta.get("tool_calls"):
                self.arrivals.append(now)
                break

    def record(self) -> dict[str, Any]:
        """`itl` (the gaps between token events, seconds), `tokens`, and `usage` when one came."""
        gaps = [b - a for a, b in itertools.pairwise(self.arrivals)]
        out: dict[str, Any] = {"itl": gaps, "tokens": len(self.arrivals)}
        if self.usage is not None:
            out["usage"] = self.usage
        return out


async def replay(
    url: str | list[str], trace: list[dict[str, Any]], headers: dict[str, str], timeout_s: float
) -> dict[str, Any]:
    urls = [url] if isinstance(url, str) else url
    conn = aiohttp.TCPConnector(limit=0)
    results: list[dict[str, Any]] = [{} for _ in trace]
    done: dict[str, asyncio.Event] = {}
    t0 = time.perf_counter() + 0.2

    async with aiohttp.ClientSession(
        connector=conn, timeout=aiohttp.ClientTimeout(total=timeout_s)
    ) as session:

        async def one(
            i: int, item: dict[str, Any], prev: asyncio.Event | None, mine: asyncio.Event | None
        ) -> None:
            res = results[i]
            limit: asyncio.Timeout | None = None
            try:
                delay = t0 + item["t"] - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                if prev is not None:
                    await prev.wait()
                start = time.perf_counter()
                res["sent"] = start - t0
                first = 0.0
                clock = EventClock()
                refusal = b""
                async with asyncio.timeout(item.get("give_up")) as limit:
                    async with session.post(
                        urls[i % len(urls)],
                        data=orjson.dumps(item["body"]),
                        headers={**headers, **item.get("headers", {})},
                    ) as r:
                        res["status"] = r.status
                        for name, key in ANSWER_HEADERS.items():
                            if value := r.headers.get(name):
                                res[key] = value
                        if r.status != 200:
                            limit.reschedule(None)  # refused in time
                        async for chunk in r.content.iter_any():
                            now = time.perf_counter()
                            if r.status != 200:
                                refusal += chunk
                                continue
                            if not first and b"data:" in chunk:
                                first = now
                                limit.reschedule(None)
                            clock.feed(chunk, now)
                        end = time.perf_counter()
                if r.status == 200 and first:
                    res["ttft"] = first - start
                    res["total"] = end - start
                    res.update(clock.record())
                elif refusal:
                    res["code"] = error_code(refusal)
            except TimeoutError as e:
                if limit is not None and limit.expired():
                    res["gave_up"] = True
                else:
                    res["error"] = type(e).__name__
            except (aiohttp.ClientError, OSError) as e:
                res["error"] = type(e).__name__
            finally:
                if mine is not None:
                    mine.set()

        tasks = []
        for i, item in enumerate(trace):
            sid = item.get("session")
            prev = done.get(sid) if sid else None
            mine = asyncio.Event() if sid else None
            if sid and mine is not None:
                done[sid] = mine
            tasks.append(asyncio.create_task(one(i, item, prev, mine)))
        await asyncio.gather(*tasks)
    wall = time.perf_counter() - t0
    r = resource.getrusage(resource.RUSAGE_SELF)
    return {"results": results, "wall_s": wall, "client_cpu_s": r.ru_utime + r.ru_stime}


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.tracerunner")
    ap.add_argument("--url", action="append", required=True, help="repeatable: round robin per request")
    ap.add_argument("--trace", required=True)
    ap.add_argument("--header", action="append", default=[])
    ap.add_argument("--timeout", type=float, default=120.0)
    # a file, not stdout: a result of many requests outgrows a pipe, and a parent busy on a loaded
    # machine then received it cut at the pipe's 64 KiB
    ap.add_argument("--out", required=True, help="where the results go (JSON)")
    a = ap.parse_args()
    with open(a.trace, "rb") as f:
        trace = [orjson.loads(line) for line in f if line.strip()]
    headers = {"content-type": "application/json"}
    for h in a.header:
        k, _, v = h.partition(":")
        headers[k.strip()] = v.strip()
    uvloop.install()
    out = asyncio.run(replay(a.url, trace, headers, a.timeout))
    with open(a.out, "wb") as f:
        f.write(orjson.dumps(out))


if __name__ == "__main__":
    main()
