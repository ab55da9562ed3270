"""Where stored responses live: Redis (shared by every replica) or this process's memory (bounded).

    ResponseStore        the interface: put / get / delete, each scoped to an owner
    MemoryResponseStore  an LRU of at most `max_entries` records, each dropped after `ttl_s`
    RedisResponseStore   one key per response (`gw:resp:<id>`, the record as JSON), expiring after
                         `ttl_s`, through the process's Redis client

A record belongs to the principal that made it (`owner`): any other principal reads it as absent,
so another user's id answers exactly as an unknown id does (404). Ids are unguessable enough to be
unique (192 random bits) but the owner check, not the id, is what keeps them private.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson
from redis.asyncio import Redis

from gateway.core.context import Principal

_PREFIX = "gw:resp:"


def owner_of(principal: Principal) -> str:
    """The owner key of a principal: tenant and user (every anonymous caller is one owner)."""
    return f"{principal.tenant or ''}/{principal.user}"


@dataclass(slots=True)
class StoredResponse:
    owner: str
    #: the Response object as the client received it
    response: dict[str, Any]
    #: this request's own input items, each with an `id` (GET /v1/responses/{id}/input_items)
    input_items: list[dict[str, Any]] = field(default_factory=list)
    #: every item of the conversation up to and including this response's output (what a
    #: `previous_response_id` continues from; instructions are not carried over, as at OpenAI)
    context: list[dict[str, Any]] = field(default_factory=list)

    @property
    def id(self) -> str:
        return str(self.response["id"])

    def dumps(self) -> bytes:
        # not dataclasses.asdict: it deep-copies every nested dict and list first
        return orjson.dumps(
            {
                "owner": self.owner,
                "response": self.response,
                "input_items": self.input_items,
                "context": self.context,
            }
        )

    @classmethod
    def loads(cls, raw: bytes | str) -> StoredResponse | None:
        try:
            obj = orjson.loads(raw)
            return cls(obj["owner"], obj["response"], obj["input_items"], obj["context"])
        except (orjson.JSONDecodeError, KeyError, TypeError):
            return None


class ResponseStore(Protocol):
    #: True when every replica sees the same records
    shared: bool

    async def put(self, record: StoredResponse) -> None: ...

    async def get(self, owner: str, response_id: str) -> StoredResponse | None: ...

    async def delete(self, owner: str, response_id: str) -> bool: ...


class MemoryResponseStore:
    """This process only: at most `max_entries` records (least recently used go first), `ttl_s` each."""

    shared = False

    def __init__(self, ttl_s: float, max_entries: int, clock: Any = time.monotonic) -> None:
        self._ttl = ttl_s
        self._max = max_entries
        self._clock = clock
        self._records: OrderedDict[str, tuple[float, StoredResponse]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._records)

    async def put(self, record: StoredResponse) -> None:
        records = self._records
        records[record.id] = (self._clock() + self._ttl, record)
        records.move_to_end(record.id)
        while len(records) > self._max:
            records.popitem(last=False)

    def _live(self, response_id: str) -> StoredResponse | None:
        found = self._records.get(response_id)
        if found is None:
            return None
        expires, record = found
        if expires <= self._clock():
            del self._records[response_id]
            return None
        return record

    async def get(self, owner: str, response_id: str) -> StoredResponse | None:
        record = self._live(response_id)
        if record is None or record.owner != owner:
            return None
        self._records.move_to_end(response_id)
        return record

    async def delete(self, owner: str, response_id: str) -> bool:
        record = self._live(response_id)
        if record is None or record.owner != owner:
            return False
        del self._records[response_id]
        return True


class RedisResponseStore:
    """Shared by every replica: `SET gw:resp:<id> <record> EX ttl`; reads check the owner."""

    shared = True

    def __init__(self, redis: Redis, ttl_s: float) -> None:
        self._redis = redis
        self._ttl_ms = max(1, int(ttl_s * 1000))

    async def put(self, record: StoredResponse) -> None:
        await self._redis.set(_PREFIX + record.id, record.dumps(), px=self._ttl_ms)

    async def get(self, owner: str, response_id: str) -> StoredResponse | None:
        raw = await self._redis.get(_PREFIX + response_id)
        if raw is None:
            return None
        record = StoredResponse.loads(raw)
        if record is None or record.owner != owner:
            return None
        return record

    async def delete(self, owner: str, response_id: str) -> bool:
        if await self.get(owner, response_id) is None:
            return False
        return bool(await self._redis.delete(_PREFIX + response_id))
