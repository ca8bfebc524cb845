-- Waiter queue, prepended to both acquire scripts and the undo (see DESIGN.md, "Waiter queue"),
-- and the lock-type check both acquire scripts make.
-- KEYS[3]: the queue, a ZSET of waiter ids ordered by arrival (a sequence with one node; the
-- waiter's own clock in microseconds with N nodes, so that every node orders the same waiters
-- the same way).
-- KEYS[4]: each waiter's lease end in server milliseconds.
-- KEYS[5]: each waiter's join time in server milliseconds (when it entered the queue): the
-- barging bound is measured from it.
-- All three keys are in the lock key's hash slot and carry a TTL. A waiter that stops
-- re-checking falls out when its lease ends, so a crashed waiter holds the queue up for one
-- lease at most. Only ferrolock waiters queue: other clients (redis-py, node-redlock, Redisson)
-- ignore the queue and exclude by the key alone.
local Q, L, S = KEYS[3], KEYS[4], KEYS[5]
-- 'SPUBLISH' on a Redis Cluster with sharded pub/sub (set by the script this is prepended to,
-- from its sharded flag): the waiters' channels are in the key's slot, so the message stays on
-- the slot's shard instead of crossing the whole cluster bus.
local PUBLISH = 'PUBLISH'
local now
-- Set when queue_head() dropped waiters whose lease had ended (the head may have changed).
local pruned = false
local function clock()
  if not now then
    local t = redis.call('TIME')
    now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return now
end
-- The first waiter whose lease has not ended, or nil. With nobody queued it costs one PTTL.
local function queue_head()
  if redis.call('PTTL', Q) == -2 then
    return nil
  end
  local gone = redis.call('ZRANGEBYSCORE', L, '-inf', clock())
  for _, w in ipairs(gone) do
    redis.call('ZREM', Q, w)
    redis.call('ZREM', S, w)
  end
  if #gone > 0 then
    redis.call('ZREMRANGEBYSCORE', L, '-inf', clock())
    pruned = true
  end
  return redis.call('ZRANGE', Q, 0, 0)[1]
end
-- Joins the queue, or stays in it and renews the lease. id '' means "does not wait" (a first
-- try, or wait=0); score '' means "strict arrival order on this node" (the first place is kept).
-- since: the join time to record when the id was not queued (nil: now).
local function enqueue(id, score, lease, since)
  if id == '' then
    return
  end
  local fresh = not redis.call('ZSCORE', Q, id)
  if score == '' then
    if fresh then
      local last = redis.call('ZRANGE', Q, -1, -1, 'WITHSCORES')[2]
      redis.call('ZADD', Q, (tonumber(last) or 0) + 1, id)
    end
  else
    redis.call('ZADD', Q, score, id)
  end
  if fresh then
    redis.call('ZADD', S, since or clock(), id)
  end
  redis.call('ZADD', L, clock() + lease, id)
  local keep = math.max(lease, redis.call('PTTL', Q))
  redis.call('PEXPIRE', Q, keep)
  redis.call('PEXPIRE', L, keep)
  redis.call('PEXPIRE', S, keep)
end
local function dequeue(id)
  if id ~= '' then
    redis.call('ZREM', Q, id)
    redis.call('ZREM', L, id)
    redis.call('ZREM', S, id)
  end
end
-- Bounded barging: a free lock goes to the head, or to anyone while the head has been queued
-- for less than `bound` ms (server clock). A head without a join time counts as past the bound.
local function may_take(head, id, bound)
  if not head or head == id then
    return true
  end
  local since = redis.call('ZSCORE', S, head)
  return since ~= false and clock() - tonumber(since) < bound
end
-- Targeted wake-ups (plain locks): each waiting process listens on a channel of its own,
-- `<release channel>:<waiter id>`, and only the queue head's process is told that the lock may
-- be free ('0' released, 'q' the head changed on a free lock, '?' a waiter left). prefix '' =
-- none (reentrant locks: Redisson's channel carries Redisson's messages to every waiter).
-- Returns 1 when some waiter was told.
local function wake_head(prefix, message)
  if prefix == '' then
    return 0
  end
  local head = queue_head()
  if head then
    redis.call(PUBLISH, prefix .. head, message)
    return 1
  end
  return 0
end
-- Quiet streaks: while the head is within the barging bound, a release does not tell it (the
-- releasing process usually takes the lock back at once, and a woken head would only lose the
-- race and cost CPU). Every release after the bound tells it, so a waiter re-checks by itself
-- once, when its bound ends (a quiet release whose process never came back left the lock
-- free): the busy hint `ms` is cut to that moment (-1, no TTL, becomes it).
local function recheck(ms, id, bound)
  if id == '' then
    return ms
  end
  local since = redis.call('ZSCORE', S, id)
  if not since then
    return ms
  end
  local left = tonumber(since) + bound - clock() + 1
  if left <= 0 or (ms >= 0 and ms <= left) then
    return ms
  end
  return left
end
-- Free, but another waiter has the turn: re-check when its lease would run out.
local function lease_left(head)
  local ends = redis.call('ZSCORE', L, head)
  if not ends then
    return 0
  end
  return math.max(0, tonumber(ends) - clock())
end
-- The fence part of a grant: '' none, '1' INCR here (one node), '0' read (N nodes).
local function fence_reply(counter, mode)
  if mode == '1' then
    return {redis.call('INCR', counter)}
  elseif mode == '0' then
    return {tonumber(redis.call('GET', counter) or '0')}
  end
  return nil
end

-- A key of a type no lock has (list, set, zset, stream) would never be released: an error
-- reply naming the key and its type (its words are read by `refusal.rs`), so the acquire
-- refuses it instead of waiting; nil for a missing key (pttl -2) or a lock's type. Read-only,
-- so safe to run twice.
-- A short decimal number with no TTL is a semaphore's permit counter (Redisson's layout), which
-- is never deleted: a lock on its name would wait forever. No lock token is one (ferrolock's
-- hold a '-'; redis-py's, node-redlock's and Redisson's are 32 hex digits or more).
local function is_counter(value)
  return #value <= 10 and string.match(value, '^%d+$') ~= nil
end
local function foreign_type(key, pttl)
  if pttl == -2 then
    return nil
  end
  local t = redis.call('TYPE', key)['ok']
  if t ~= 'string' and t ~= 'hash' then
    return redis.error_reply('WRONGTYPE key ' .. key .. ' holds a ' .. t .. ', not a lock')
  end
  if t == 'string' and pttl == -1 and is_counter(redis.call('GET', key)) then
    return redis.error_reply('WRONGTYPE key ' .. key .. " holds a semaphore's permit counter, not a lock")
  end
  return nil
end
