"""The few Redis commands the engine comparison and the rebalancing loop use, in memory, with an
outage switch: pipelines of HINCRBY, EXPIRE and HGETALL, and SET (NX, PX, EX) and GET. TTLs are
recorded, not applied."""

from __future__ import annotations

from types import TracebackType
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError


class FakeRedis:
    def __init__(self) -> None:
        self.hashes: dict[str, dict[bytes, bytes]] = {}
        self.strings: dict[str, bytes] = {}
        self.ttls: dict[str, float] = {}
        self.down = False
        self.round_trips = 0

    def _check(self) -> None:
        if self.down:
            raise RedisConnectionError("Redis is down (test)")
        self.round_trips += 1

    def pipeline(self, transaction: bool = True) -> Pipeline:
        return Pipeline(self)

    async def set(
        self, key: str, value: Any, nx: bool = False, px: int | None = None, ex: int | None = None
    ) -> bool:
        self._check()
        if nx and key in self.strings:
            return False
        self.strings[key] = value if isinstance(value, bytes) else str(value).encode()
        if px is not None or ex is not None:
            self.ttls[key] = px / 1000 if px is not None else float(ex or 0)
        return True

    async def get(self, key: str) -> bytes | None:
        self._check()
        return self.strings.get(key)

    async def delete(self, key: str) -> int:
        self._check()
        return int(self.strings.pop(key, None) is not None)


class Pipeline:
    def __init__(self, redis: FakeRedis) -> None:
        self._redis = redis
        self._ops: list[tuple[str, tuple[Any, ...]]] = []

    async def __aenter__(self) -> Pipeline:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        return None

    def hincrby(self, key: str, field: str, amount: int) -> None:
        self._ops.append(("hincrby", (key, field, amount)))

    def expire(self, key: str, seconds: int) -> None:
        self._ops.append(("expire", (key, seconds)))

    def hgetall(self, key: str) -> None:
        self._ops.append(("hgetall", (key,)))

    async def execute(self) -> list[Any]:
        self._redis._check()
        out: list[Any] = []
        hashes = self._redis.hashes
        for op, args in self._ops:
            if op == "hincrby":
                key, field, amount = args
                h = hashes.setdefault(key, {})
                h[field.encode()] = str(int(h.get(field.encode(), b"0")) + amount).encode()
                out.append(int(h[field.encode()]))
            elif op == "expire":
                self._redis.ttls[args[0]] = float(args[1])
                out.append(True)
            else:
                out.append(dict(hashes.get(args[0], {})))
        self._ops = []
        return out
