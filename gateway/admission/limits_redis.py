"""Limits shared by every replica: an exact sliding-window log in Redis, one EVALSHA per request.

Keys of one scope (a user, or a tenant), all with the same hash tag so one script may touch them in
Redis Cluster — the tag is the tenant when there is one (a tenant's users and the tenant itself
share a slot, so a request is checked against both atomically), else the user:

    gw:rl:{t:acme}:u:alice:req   sorted set  member = request id,          score = arrival (ms)
    gw:rl:{t:acme}:u:alice:tok   sorted set  member = "<id>:<tokens>",     score = arrival (ms)
    gw:rl:{t:acme}:u:alice:sum   string      sum of the <tokens> in :tok
    gw:rl:{t:acme}:u:alice:con   sorted set  member = request id,          score = lease expiry (ms)
    gw:rl:{t:acme}:t:req / :tok / :sum / :con   the same for the tenant

Budgets and spend (gateway/admission/spend.py names them), with the same hash tag:

    gw:sp:{t:acme}:u:alice:d:2026-12-01   hash  tok, usd, req and m:<model>:tok|usd|req of one UTC day
    gw:sp:{t:acme}:u:alice:m:2026-12      hash  the same for one UTC month
    gw:sp:{t:acme}:u:alice:w3600:usd      sorted set  a rolling budget's log: member "<id>:<amount>"
    gw:sp:{t:acme}:u:alice:w3600:usd:sum  string      its running sum
    … :t: for the tenant, :k:<key id>: for an API key

Time is Redis's own (`TIME` inside the script), so replicas' clocks never matter. Every key carries
a TTL of one window (one lease for `:con`), so idle users cost nothing.

Concurrency slots are leases: this replica renews the slots it holds every `lease / 3`; a replica
that dies stops renewing and its slots vanish after at most one lease.

Shared routing state rides in the same two scripts (gateway/core/shared_load.py; docs/routing.md,
*Shared load*), under its own hash tag (so not on Redis Cluster, where the root leaves it off):

    gw:rt:{rt}:live        hash    field = routing process, value = "<lease expiry ms>|" + a JSON
                                   object: its figures by name (in-flight requests by backend, and
                                   under prefixed names its working sets and queued prefill), as of
                                   its last call
    gw:rt:{rt}:g:<key>     string  the backend a prefix group was placed on (set once, PX ttl)
    gw:rt:{rt}:placed      hash    field = backend, value = "<blocks>|<as of ms>": the blocks of the
                                   groups placed there, halving every placement ttl (`PlacedBlocks`)

Every call of a process (a request's admission, its finish, the renewer while it has requests in
flight and nothing else to say) rewrites its field; the admission and the renewer also read the
others' live fields, which the caller sums per backend (a finish does not: its request was routed).
Redis runs every process's scripts in turn, so the script only selects the live fields; unpacking
and summing them is the gateway's work, which grows with its own fleet of processes. A field past its
expiry (a process that died) is deleted by whoever reads it next. So a process's counts are as fresh
as its last call, and a dead one's vanish after one lease.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import orjson
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from gateway.admission.limits import Spend, SpendFigures, StoreDown, Ticket
from gateway.core.outage_log import OutageLog
from gateway.core.redis_wire import ReplyError, RespClient, WireDown
from gateway.core.shared_load import LoadShare, ShareAsk, ShareReply
from gateway.core.tasks import cancel_and_wait, stop_requested
from policies.admission import Outcome, ScopeLimits, Verdict
from policies.budgets import Charge

log = logging.getLogger("gateway.limits")

_OUTAGE = (RedisConnectionError, RedisTimeoutError, OSError, WireDown)
#: error replies that mean "Redis cannot serve right now" (restarting, failing over), not a bug
_TRANSIENT = ("LOADING", "BUSY", "MASTERDOWN", "READONLY", "TRYAGAIN", "CLUSTERDOWN")

# The shared routing state (see the module docstring), one Lua function both scripts include: `q` is
# the index before its ARGV (process, lease_ms, JSON counts, proposal or '', placement ttl_ms,
# and with a group: its blocks, C, C candidates), `load`, `group` and `placed_blocks` its keys (group
# nil: no placement asked), `placing` whether a proposal may be set, `read` whether the others' counts
# are wanted (a finish only writes: its request was routed, and the next admission reads them). A group
# without a placement goes to the candidate with the fewest placed blocks (the first of equals; the
# proposal when C is 0), as `policies.shared_load.PlacedBlocks.place` does. Returns the other live
# processes' figures, each its JSON object as stored (empty without `read`; the caller sums them:
# `_others`), the placement (false when none) and 1 when this call set it (else 0).
SHARE_LUA = """
local function share(load, group, q, placing, placed_blocks, read)
  local proc, lease, counts = ARGV[q + 1], tonumber(ARGV[q + 2]), ARGV[q + 3]
  if counts == '' then
    redis.call('HDEL', load, proc)
  else
    redis.call('HSET', load, proc, (now + lease) .. '|' .. counts)
  end
  redis.call('PEXPIRE', load, lease * 2)
  if not read then return {}, false, 0 end  -- a finish: write only (its request was routed)
  local flat, i = {}, 0
  local all = redis.call('HGETALL', load)
  for j = 1, #all, 2 do
    if all[j] ~= proc then
      local v = all[j + 1]
      local bar = string.find(v, '|', 1, true)
      if bar == nil or tonumber(string.sub(v, 1, bar - 1)) < now then
        redis.call('HDEL', load, all[j])
      else
        i = i + 1
        flat[i] = string.sub(v, bar + 1)  -- its figures as it packed them: summed by the caller
      end
    end
  end
  local placed, fresh = false, 0
  if group then
    local ttl = ARGV[q + 5]
    if placing and ARGV[q + 4] ~= '' and redis.call('EXISTS', group) == 0 then
      local choice, best = ARGV[q + 4], nil
      local blocks, nc, half = tonumber(ARGV[q + 6] or '0'), tonumber(ARGV[q + 7] or '0'), tonumber(ttl)
      for j = 1, nc do
        local name, held = ARGV[q + 7 + j], 0
        local v = redis.call('HGET', placed_blocks, name)
        if v then
          local bar = string.find(v, '|', 1, true)
          local age = now - tonumber(string.sub(v, bar + 1))
          held = tonumber(string.sub(v, 1, bar - 1)) * math.pow(0.5, age / half)
        end
        if best == nil or held < best then best, choice = held, name end
      end
      redis.call('SET', group, choice, 'PX', ttl)  -- (the script is atomic: none exists)
      fresh = 1
      if best ~= nil then
        redis.call('HSET', placed_blocks, choice, (best + blocks) .. '|' .. now)
        redis.call('PEXPIRE', placed_blocks, ttl)
      end
    end
    placed = redis.call('GET', group)
    if placed then redis.call('PEXPIRE', group, ttl) end
  end
  return flat, placed, fresh
end
"""

# KEYS: 4 per scope (req, tok, sum, con), then one per ledger, then two per rolling budget (log,
# sum). ARGV: window_ms, id, cost, lease_ms, n, then per scope requests, tokens, concurrent (0 =
# unlimited); then (optional, budgets and ledgers) L ledgers, C calendar budgets, R rolling budgets,
# the reserved tokens, the reserved nano-dollars, L ledger expiries (Unix ms), per calendar budget
# (its ledger's index from 1, unit 0 tokens / 1 money, limit), per rolling budget (unit, limit,
# window_ms). Returns {outcome, scope, retry_ms, limit_req, remaining_req, reset_req_ms, limit_tok,
# remaining_tok, reset_tok_ms, used, requested}; for a budget, scope is its index among the budgets
# (calendar ones first) and retry_ms is set for rolling ones only. With shared routing state (the
# budget part then present, zeros when there are no budgets): after the rolling budgets' keys the
# load hash and optionally the group key and the placed-blocks hash, after their ARGV the share's
# (SHARE_LUA); the reply then also holds the other processes' counts, the group's placement and
# whether this call set it.
ACQUIRE = (
    """
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""
    + SHARE_LUA
    + """
local window = tonumber(ARGV[1])
local id = ARGV[2]
local cost = tonumber(ARGV[3])
local lease = tonumber(ARGV[4])
local n = tonumber(ARGV[5])
local cutoff = now - window
local rpm, tpm, con, rq_used, tk_used, rq_old, tk_old = {}, {}, {}, {}, {}, {}, {}
local fail, fail_scope, retry, used, requested = 0, 0, 0, 0, 0

local function oldest(key)
  local o = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  if o[2] then return tonumber(o[2]) end
  return now
end

-- A sliding log of amounts (member "<id>:<amount>", the running sum at `sum`): drop what arrived
-- at or before `cut`, return the sum of the rest.
local function window_sum(key, sum, cut)
  local gone = redis.call('ZRANGEBYSCORE', key, '-inf', cut)
  if #gone > 0 then
    local freed = 0
    for _, m in ipairs(gone) do freed = freed + tonumber(string.match(m, ':(%d+)$')) end
    redis.call('ZREMRANGEBYSCORE', key, '-inf', cut)
    redis.call('DECRBY', sum, freed)
  end
  if redis.call('ZCARD', key) == 0 then
    redis.call('DEL', sum)
    return 0
  end
  return tonumber(redis.call('GET', sum) or '0')
end

-- The time until enough of the log's oldest amounts leave a window of `span` ms for `need` more.
local function wait_for(key, need, span)
  local freed, start = 0, 0
  while freed < need do
    local page = redis.call('ZRANGE', key, start, start + 63, 'WITHSCORES')
    if #page == 0 then break end
    for j = 1, #page, 2 do
      freed = freed + tonumber(string.match(page[j], ':(%d+)$'))
      if freed >= need then return tonumber(page[j + 1]) + span - now end
    end
    start = start + 64
  end
  return 0
end

for i = 1, n do
  local k = (i - 1) * 4
  local a = 5 + (i - 1) * 3
  rpm[i] = tonumber(ARGV[a + 1]); tpm[i] = tonumber(ARGV[a + 2]); con[i] = tonumber(ARGV[a + 3])
  if rpm[i] > 0 then
    local key = KEYS[k + 1]
    redis.call('ZREMRANGEBYSCORE', key, '-inf', cutoff)
    rq_used[i] = redis.call('ZCARD', key)
    rq_old[i] = oldest(key)
    if fail == 0 and rq_used[i] + 1 > rpm[i] then
      local e = redis.call('ZRANGE', key, rq_used[i] - rpm[i], rq_used[i] - rpm[i], 'WITHSCORES')
      fail, fail_scope, retry, used, requested = 1, i, tonumber(e[2]) + window - now, rq_used[i], 1
    end
  end
  if tpm[i] > 0 then
    local key = KEYS[k + 2]
    tk_used[i] = window_sum(key, KEYS[k + 3], cutoff)
    tk_old[i] = oldest(key)
    if fail == 0 and cost > tpm[i] then
      fail, fail_scope, retry, used, requested = 4, i, window, tk_used[i], cost
    elseif fail == 0 and tk_used[i] + cost > tpm[i] then
      fail, fail_scope, used, requested = 2, i, tk_used[i], cost
      retry = wait_for(key, tk_used[i] + cost - tpm[i], window)
    end
  end
  if con[i] > 0 and fail == 0 then
    local key = KEYS[k + 4]
    redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
    if redis.call('ZCARD', key) + 1 > con[i] then
      fail, fail_scope, retry, used, requested = 3, i, 1000, con[i], 1
    end
  end
end

-- budgets, checked only when every limit passed
local b = 5 + n * 3
local nl, nc, nr = tonumber(ARGV[b + 1] or '0'), tonumber(ARGV[b + 2] or '0'), tonumber(ARGV[b + 3] or '0')
local amount = {tonumber(ARGV[b + 4] or '0'), tonumber(ARGV[b + 5] or '0')}
local member = {ARGV[b + 4], ARGV[b + 5]}
local field = {'tok', 'usd'}
local lk, ca = n * 4, b + 5 + nl
local rk, ra = lk + nl, ca + nc * 3
if fail == 0 then
  for j = 1, nc do
    local a = ca + (j - 1) * 3
    local u, limit = tonumber(ARGV[a + 2]) + 1, tonumber(ARGV[a + 3])
    local have = tonumber(redis.call('HGET', KEYS[lk + tonumber(ARGV[a + 1])], field[u]) or '0')
    if amount[u] > limit then
      fail, fail_scope, used, requested = 6, j, have, amount[u]
      break
    elseif have + amount[u] > limit then
      fail, fail_scope, used, requested = 5, j, have, amount[u]
      break
    end
  end
end
if fail == 0 then
  for j = 1, nr do
    local a = ra + (j - 1) * 3
    local u, limit, span = tonumber(ARGV[a + 1]) + 1, tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
    local key = KEYS[rk + j * 2 - 1]
    local have = window_sum(key, KEYS[rk + j * 2], now - span)
    if amount[u] > limit then
      fail, fail_scope, used, requested = 6, nc + j, have, amount[u]
      break
    elseif have + amount[u] > limit then
      fail, fail_scope, used, requested = 5, nc + j, have, amount[u]
      retry = wait_for(key, have + amount[u] - limit, span)
      break
    end
  end
end

local add = 0
if fail == 0 then add = 1 end
local lr, rr, sr, lt, rt, st = 0, 0, 0, 0, 0, 0
for i = 1, n do
  local k = (i - 1) * 4
  if rpm[i] > 0 then
    if add == 1 then
      redis.call('ZADD', KEYS[k + 1], now, id)
      redis.call('PEXPIRE', KEYS[k + 1], window)
    end
    local rem = rpm[i] - rq_used[i] - add
    if lr == 0 or rem < rr then lr, rr, sr = rpm[i], rem, rq_old[i] + window - now end
  end
  if tpm[i] > 0 then
    if add == 1 then
      redis.call('ZADD', KEYS[k + 2], now, id .. ':' .. cost)
      redis.call('INCRBY', KEYS[k + 3], cost)
      redis.call('PEXPIRE', KEYS[k + 2], window)
      redis.call('PEXPIRE', KEYS[k + 3], window)
    end
    local rem = tpm[i] - tk_used[i] - add * cost
    if lt == 0 or rem < rt then lt, rt, st = tpm[i], rem, tk_old[i] + window - now end
  end
  if con[i] > 0 and add == 1 then
    redis.call('ZADD', KEYS[k + 4], now + lease, id)
    redis.call('PEXPIRE', KEYS[k + 4], lease)
  end
end
if add == 1 then
  for j = 1, nl do
    local key = KEYS[lk + j]
    if amount[1] > 0 then redis.call('HINCRBY', key, 'tok', member[1]) end
    if amount[2] > 0 then redis.call('HINCRBY', key, 'usd', member[2]) end
    redis.call('PEXPIREAT', key, ARGV[b + 5 + j])
  end
  for j = 1, nr do
    local a = ra + (j - 1) * 3
    local u, span = tonumber(ARGV[a + 1]) + 1, ARGV[a + 3]
    local key, sum = KEYS[rk + j * 2 - 1], KEYS[rk + j * 2]
    redis.call('ZADD', key, now, id .. ':' .. member[u])
    redis.call('INCRBY', sum, member[u])
    redis.call('PEXPIRE', key, span)
    redis.call('PEXPIRE', sum, span)
  end
end
local q = ra + nr * 3
if ARGV[q + 1] then
  local flat, placed, fresh = share(KEYS[rk + nr * 2 + 1], KEYS[rk + nr * 2 + 2], q, add == 1, KEYS[rk + nr * 2 + 3], true)
  return {fail, fail_scope, retry, lr, rr, sr, lt, rt, st, used, requested, flat, placed, fresh}
end
return {fail, fail_scope, retry, lr, rr, sr, lt, rt, st, used, requested}
"""
)

# KEYS: 4 per scope, then one per ledger, then two per rolling budget (log, sum). ARGV: id,
# reserved, kept, n, then per scope has_tokens, has_concurrency; then (optional) L ledgers, R
# rolling budgets, the ledgers' token and money deltas (kept minus reserved), the kept
# tokens and nano-dollars, the reserved tokens and nano-dollars, the model, L ledger expiries (Unix
# ms), per rolling budget its unit (0 tokens, 1 money). Amounts travel as decimal strings. With
# shared routing state: L and R are present (0 0 and nothing else when there is no spend), then the
# load hash's key after the others and the share's ARGV (SHARE_LUA) last: it writes this process's
# counts and reads nothing back. Returns 1.
FINISH = (
    """
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""
    + SHARE_LUA
    + """
local id, reserved, kept, n = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
for i = 1, n do
  local k = (i - 1) * 4
  if ARGV[4 + (i - 1) * 2 + 1] == '1' and kept ~= reserved then
    local old = id .. ':' .. reserved
    local score = redis.call('ZSCORE', KEYS[k + 2], old)
    if score then
      redis.call('ZREM', KEYS[k + 2], old)
      if kept > 0 then redis.call('ZADD', KEYS[k + 2], score, id .. ':' .. kept) end
      redis.call('INCRBY', KEYS[k + 3], kept - reserved)
    end
  end
  if ARGV[4 + (i - 1) * 2 + 2] == '1' then redis.call('ZREM', KEYS[k + 4], id) end
end
local b = 4 + n * 2
local nl, nr = tonumber(ARGV[b + 1] or '0'), tonumber(ARGV[b + 2] or '0')
local lk = n * 4
local q = b + 2
if nl + nr > 0 then
  local dt, du, kt, ku, rt, ru, model = ARGV[b + 3], ARGV[b + 4], ARGV[b + 5], ARGV[b + 6], ARGV[b + 7], ARGV[b + 8], ARGV[b + 9]
  for j = 1, nl do
    local key = KEYS[lk + j]
    if dt ~= '0' then redis.call('HINCRBY', key, 'tok', dt) end
    if du ~= '0' then redis.call('HINCRBY', key, 'usd', du) end
    redis.call('HINCRBY', key, 'req', 1)
    redis.call('HINCRBY', key, 'm:' .. model .. ':tok', kt)
    if ku ~= '0' then redis.call('HINCRBY', key, 'm:' .. model .. ':usd', ku) end
    redis.call('HINCRBY', key, 'm:' .. model .. ':req', 1)
    redis.call('PEXPIREAT', key, ARGV[b + 9 + j])
  end
  local ra = b + 9 + nl
  for j = 1, nr do
    local was, now_ = rt, kt
    if ARGV[ra + j] == '1' then was, now_ = ru, ku end
    if was ~= now_ then
      local key, sum = KEYS[lk + nl + j * 2 - 1], KEYS[lk + nl + j * 2]
      local old = id .. ':' .. was
      local score = redis.call('ZSCORE', key, old)
      if score then
        redis.call('ZREM', key, old)
        if now_ ~= '0' then redis.call('ZADD', key, score, id .. ':' .. now_) end
        redis.call('INCRBY', sum, tonumber(now_) - tonumber(was))
      end
    end
  end
  q = ra + nr
end
if ARGV[q + 1] then
  share(KEYS[lk + nl + nr * 2 + 1], nil, q, false, nil, false)
end
return 1
"""
)

# KEYS[1]: the load hash. ARGV: the share's (SHARE_LUA). The renewer's report of a process with
# requests in flight that made no other call for a while; returns the other processes' counts.
REPORT = (
    """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""
    + SHARE_LUA
    + """
return (share(KEYS[1], nil, 0, false, nil, true))
"""
)

# KEYS: ledgers, then rolling logs. ARGV: L, then per log its window (ms). Returns each ledger's
# fields (flat name/value lists) and each log's sum over its window, by Redis's own clock.
READ_SPEND = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local nl = tonumber(ARGV[1])
local ledgers, sums = {}, {}
for j = 1, nl do ledgers[j] = redis.call('HGETALL', KEYS[j]) end
for j = nl + 1, #KEYS do
  local total = 0
  for _, m in ipairs(redis.call('ZRANGEBYSCORE', KEYS[j], '(' .. (now - tonumber(ARGV[j + 1])), '+inf')) do
    total = total + tonumber(string.match(m, ':(%d+)$'))
  end
  sums[j - nl] = total
end
return {ledgers, sums}
"""

# KEYS: the `:con` keys of one slot. ARGV: lease_ms, id. Renews the slot where it still exists.
RENEW = """
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local expiry = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[1])
for _, key in ipairs(KEYS) do
  if redis.call('ZADD', key, 'XX', 'CH', expiry, ARGV[2]) == 1 then
    redis.call('PEXPIRE', key, ARGV[1])
  end
end
return 1
"""


class WireScript:
    """A Lua script over `RespClient`: EVALSHA, and EVAL once when the server lost its script cache
    (a restarted Redis); the same contract as redis-py's `Script.__call__(keys=, args=)`."""

    def __init__(self, client: RespClient, source: str) -> None:
        self._client = client
        self._source = source
        self._sha = hashlib.sha1(source.encode()).hexdigest()

    async def __call__(self, keys: Sequence[str], args: Sequence[Any]) -> Any:
        try:
            return await self._client.call("EVALSHA", self._sha, len(keys), *keys, *args)
        except ReplyError as exc:
            if not str(exc).startswith("NOSCRIPT"):
                raise
        return await self._client.call("EVAL", self._source, len(keys), *keys, *args)


def scope_keys(scope: ScopeLimits) -> tuple[str, str, str, str]:
    k = scope.key
    return (k + ":req", k + ":tok", k + ":sum", k + ":con")


_UNIT = {"tokens": 0, "usd": 1}


def _budget_args(spend: Spend, keys: list[str], args: list[Any]) -> None:
    """ACQUIRE's budget part (see the script's header), appended to `keys` and `args`."""
    ledgers, rolling = spend.ledgers, spend.rolling
    keys.extend(ledger.key for ledger in ledgers)
    for m in rolling:
        keys += (m.key, m.key + ":sum")
    reserved = spend.reserved
    args += (len(ledgers), spend.n_calendar, len(rolling), reserved.tokens, reserved.nanos)
    args.extend(ledger.expire_at_ms for ledger in ledgers)
    for m in spend.meters[: spend.n_calendar]:
        args += (m.ledger + 1, _UNIT[m.budget.unit], m.budget.limit)
    for m in rolling:
        args += (_UNIT[m.budget.unit], m.budget.limit, m.budget.window_s * 1000)


def _settle_args(spend: Spend, kept: Charge, keys: list[str], args: list[Any]) -> None:
    """FINISH's spend part (see the script's header), appended to `keys` and `args`."""
    ledgers, rolling, reserved = spend.ledgers, spend.rolling, spend.reserved
    keys.extend(ledger.key for ledger in ledgers)
    for m in rolling:
        keys += (m.key, m.key + ":sum")
    args += (
        len(ledgers),
        len(rolling),
        str(kept.tokens - reserved.tokens),
        str(kept.nanos - reserved.nanos),
        str(kept.tokens),
        str(kept.nanos),
        str(reserved.tokens),
        str(reserved.nanos),
        spend.model,
    )
    args.extend(ledger.expire_at_ms for ledger in ledgers)
    args.extend(_UNIT[m.budget.unit] for m in rolling)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


LOAD_KEY = "gw:rt:{rt}:live"
GROUP_KEY = "gw:rt:{rt}:g:"
PLACED_KEY = "gw:rt:{rt}:placed"


def _share_args(share: LoadShare, counts: Mapping[str, int], ask: ShareAsk | None, args: list[Any]) -> None:
    """SHARE_LUA's ARGV (see the script): process, lease, packed counts (`LoadShare.counts()`: only
    backends with requests in flight), proposal, placement ttl; with `ask`'s group its blocks and
    candidates."""
    args += (
        share.process,
        max(1, int(share.lease_s * 1000)),
        orjson.dumps(counts) if counts else b"",
        (ask.proposal or "") if ask is not None else "",
        max(1, int(share.placement_ttl_s * 1000)),
    )
    if ask is not None and ask.group is not None:
        args += (ask.blocks, len(ask.candidates), *ask.candidates)


def _others(packed: Any) -> dict[str, int]:
    """The other live processes' figures summed by name, from SHARE_LUA's reply: each one's JSON
    object as it sent it. The sum is made here, not in the script: Redis runs every process's scripts
    one at a time, and its Lua unpacking the others' maps (three figures a backend) costs it several
    times what this does (bench/share_cost.py). Here orjson reads one such object in ~6 µs, and when
    every process sent the same names in the same order (one fleet, busy on every backend) the sum is
    one pass in C. An object that does not parse counts as nothing."""
    if not isinstance(packed, list):
        return {}
    maps: list[dict[str, int]] = []
    for blob in packed:
        try:
            figures = orjson.loads(blob)
        except (orjson.JSONDecodeError, TypeError):
            continue
        if type(figures) is dict:
            maps.append(figures)
    if len(maps) < 2:
        return maps[0] if maps else {}
    names = list(maps[0])
    if all(list(m) == names for m in maps[1:]):
        return dict(zip(names, map(sum, zip(*[m.values() for m in maps], strict=True)), strict=True))
    sums = maps[0]
    get = sums.get
    for m in maps[1:]:
        for name, n in m.items():
            sums[name] = get(name, 0) + n
    return sums


#: a concurrency slot lives this long without renewal: a crashed replica's slots come back within
#: half a minute, while its renewals (every lease / 3) stay rare
LEASE_S = 30.0


class RedisLimiter:
    """The shared limiter. Contract: `acquire` is one EVALSHA round trip; any connection failure or
    timeout is raised as `StoreDown` (the caller decides what an outage means).

    With `wire` (standalone Redis), acquire and finish go over the auto-pipelining connection of
    gateway/core/redis_wire.py (~10 µs of CPU instead of ~80 µs through redis-py); the lease renewer and
    deployments on Sentinel or Cluster use the redis-py client."""

    name = "redis"

    def __init__(
        self,
        redis: Redis,
        *,
        window_s: float,
        lease_s: float = LEASE_S,
        observe: Callable[[str, float | None], None] | None = None,
        wire: RespClient | None = None,
    ) -> None:
        #: `observe(op, seconds)` after each round trip; seconds None when it failed
        self._observe = observe
        self._redis = redis
        self._window_ms = int(window_s * 1000)
        self._lease_ms = int(lease_s * 1000)
        self._lease_s = lease_s
        self._acquire: Callable[..., Any] = redis.register_script(ACQUIRE)
        self._finish: Callable[..., Any] = redis.register_script(FINISH)
        self._read_spend: Callable[..., Any] = redis.register_script(READ_SPEND)
        if wire is not None:
            self._acquire = WireScript(wire, ACQUIRE)
            self._finish = WireScript(wire, FINISH)
        self._renew = redis.register_script(RENEW)
        self._report: Callable[..., Any] = redis.register_script(REPORT)
        #: concurrency slots this replica holds: id → the `:con` keys
        self._held: dict[str, list[str]] = {}
        self._renewer: asyncio.Task[None] | None = None
        #: the routing state this process shares (None: not shared), and when it last called
        self._share: LoadShare | None = None
        self._shared_at = 0.0
        self._reporter: asyncio.Task[None] | None = None
        self._report_log = OutageLog(log, "reporting the routing counts to Redis")
        self._renew_log = OutageLog(log, "renewing the concurrency slots' leases in Redis")

    def bind_share(self, share: LoadShare) -> None:
        """Carry `share`'s routing state in this limiter's calls (gateway/core/shared_load.py)."""
        self._share = share

    @property
    def shares(self) -> bool:
        """Routing state rides in this limiter's calls (`bind_share`)."""
        return self._share is not None

    async def acquire(
        self,
        id: str,
        scopes: Sequence[ScopeLimits],
        cost: int,
        spend: Spend | None = None,
        share: ShareAsk | None = None,
    ) -> Verdict:
        keys: list[str] = []
        args: list[Any] = [self._window_ms, id, cost, self._lease_ms, len(scopes)]
        con: list[str] = []
        for s in scopes:
            ks = scope_keys(s)
            keys.extend(ks)
            args += (s.requests, s.tokens, s.concurrent)
            if s.concurrent:
                con.append(ks[3])
        if spend is not None:
            _budget_args(spend, keys, args)
        bound = self._share
        if share is not None and bound is not None:
            if spend is None:
                args += (0, 0, 0, 0, 0)  # no budgets: the part the share's arguments follow
            keys.append(LOAD_KEY)
            if share.group is not None:
                keys += (GROUP_KEY + share.group, PLACED_KEY)
            _share_args(bound, share.counts, share, args)
        observe = self._observe
        t0 = time.perf_counter()
        try:
            r = await self._acquire(keys=keys, args=args)
        except _OUTAGE as exc:
            if observe is not None:
                observe("limit", None)
            raise StoreDown(str(exc)) from exc
        except ReplyError as exc:
            if str(exc).startswith(_TRANSIENT):
                raise StoreDown(str(exc)) from exc
            raise
        if observe is not None:
            observe("limit", time.perf_counter() - t0)
        verdict = Verdict(Outcome(int(r[0])), *(int(x) for x in r[1:11]))
        if share is not None and bound is not None and len(r) > 11:
            self._shared_at = time.monotonic()
            placed = r[12] if len(r) > 12 else None
            fresh = len(r) > 13 and int(r[13]) == 1
            share.reply = ShareReply(_others(r[11]), _text(placed) if placed else None, fresh)
            self._start_reporter()
        if con and verdict.outcome is Outcome.ADMITTED:
            self._held[id] = con
            if self._renewer is None:
                self._renewer = asyncio.get_running_loop().create_task(self._renew_forever())
        return verdict

    async def finish(
        self, ticket: Ticket, kept_tokens: int, kept: Charge | None = None, share: bool = False
    ) -> None:
        """With `share`, the call also carries this process's routing counts (it reads nothing back:
        the request was routed, and the next admission reads the others')."""
        self._held.pop(ticket.id, None)
        keys: list[str] = []
        args: list[Any] = [ticket.id, ticket.reserved, kept_tokens, len(ticket.scopes)]
        needed = False
        for s in ticket.scopes:
            keys.extend(scope_keys(s))
            has_tok = s.tokens > 0 and kept_tokens != ticket.reserved
            args += ("1" if has_tok else "0", "1" if s.concurrent else "0")
            needed = needed or has_tok or s.concurrent > 0
        spend = ticket.spend
        settled = spend is not None and bool(spend.meters or spend.ledgers)
        if spend is not None and settled:
            _settle_args(spend, kept or spend.reserved, keys, args)
            needed = True
        bound = self._share if share else None
        if bound is not None:
            if not settled:
                args += (0, 0)  # no spend: the part the share's arguments follow
            keys.append(LOAD_KEY)
            _share_args(bound, bound.counts(), None, args)
            needed = True
        if not needed:
            return
        try:
            await self._finish(keys=keys, args=args)
        except _OUTAGE as exc:
            raise StoreDown(str(exc)) from exc
        except ReplyError as exc:
            if str(exc).startswith(_TRANSIENT):
                raise StoreDown(str(exc)) from exc
            raise
        if bound is not None:
            self._shared_at = time.monotonic()

    def _start_reporter(self) -> None:
        if self._reporter is None:
            self._reporter = asyncio.get_running_loop().create_task(self._report_forever())

    async def _report_forever(self) -> None:
        """Keep this process's counts alive in the store while it has anything to report (requests
        in flight, or the working sets a document's placement reads: `LoadShare.counts`) and made no
        other call for a third of the lease (long streams at low traffic, an idle process); one
        small script, off the request path."""
        share = self._share
        assert share is not None
        period = share.lease_s / 3
        while not stop_requested():
            await asyncio.sleep(period / 2)
            if time.monotonic() - self._shared_at < period or not share.counts():
                continue
            try:
                await self.report()
                self._report_log.worked()
            except Exception as exc:  # the next period tries again
                if stop_requested():
                    return
                self._report_log.failed(exc)

    async def report(self) -> None:
        """Rewrite this process's counts in the store and read the others' (the renewer's call)."""
        share = self._share
        if share is None:
            return
        args: list[Any] = []
        _share_args(share, share.counts(), None, args)
        try:
            r = await self._report(keys=[LOAD_KEY], args=args)
        except _OUTAGE as exc:
            raise StoreDown(str(exc)) from exc
        self._shared_at = time.monotonic()
        share.heard(_others(r))

    async def live(self) -> dict[str, dict[str, int]]:
        """Every live routing process's figures as it last wrote them, by process (the admin API's
        view of the replicas; StoreDown when unreachable)."""
        try:
            seconds, micros = await self._redis.time()
            raw = await self._redis.hgetall(LOAD_KEY)
        except _OUTAGE as exc:
            raise StoreDown(str(exc)) from exc
        now_ms = seconds * 1000 + micros // 1000
        out: dict[str, dict[str, int]] = {}
        for proc, value in raw.items():
            expiry, _, blob = _text(value).partition("|")
            try:
                figures = orjson.loads(blob)
            except orjson.JSONDecodeError:
                continue
            if expiry.isdigit() and int(expiry) >= now_ms and type(figures) is dict:
                out[_text(proc)] = figures
        return out

    async def read_spend(self, ledgers: Sequence[str], logs: Sequence[tuple[str, int]]) -> SpendFigures:
        """One read-only script (Redis's clock for the rolling windows); StoreDown when unreachable."""
        try:
            raw = await self._read_spend(
                keys=[*ledgers, *(key for key, _ in logs)], args=[len(ledgers), *(ms for _, ms in logs)]
            )
        except _OUTAGE as exc:
            raise StoreDown(str(exc)) from exc
        fields = [{_text(flat[i]): int(flat[i + 1]) for i in range(0, len(flat), 2)} for flat in raw[0]]
        return fields, [int(x) for x in raw[1]]

    async def _renew_forever(self) -> None:
        period = self._lease_s / 3
        while not stop_requested():
            await asyncio.sleep(period)
            if not self._held:
                continue
            try:
                await self.renew_all()
                self._renew_log.worked()
            except Exception as exc:  # the next period tries again; leases outlive two misses
                if stop_requested():  # the cancel was swallowed on its way (gateway/core/tasks.py)
                    return
                self._renew_log.failed(exc)

    async def renew_all(self) -> None:
        """Extend the lease of every slot this replica holds (one pipelined round trip)."""
        held = list(self._held.items())
        async with self._redis.pipeline(transaction=False) as pipe:
            for id, keys in held:
                await self._renew(keys=keys, args=[self._lease_ms, id], client=pipe)
            await pipe.execute()

    @property
    def held(self) -> int:
        return len(self._held)

    async def aclose(self) -> None:
        if self._renewer is not None:
            await cancel_and_wait([self._renewer], within_s=2.0, what="the lease renewer")
        if self._reporter is not None:
            await cancel_and_wait([self._reporter], within_s=2.0, what="the routing counts reporter")
