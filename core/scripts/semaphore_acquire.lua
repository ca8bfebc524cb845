-- Takes ARGV[2] permits with a lease on Redisson's RPermitExpirableSemaphore layout (issue 33;
-- sent by `semaphore.rs`). Expired ids are reclaimed first, with the server's TIME (never the
-- client's clock); a reclaim publishes the counter's new value, as Redisson's does, and so does
-- a grant that leaves permits free while a waiter is queued.
-- The pool size is counter + ZCARD(timeout) (Redisson keeps no other record of it); the first
-- acquire on a name sets the counter to ARGV[1], as trySetPermits does (less the ids still
-- held, if the counter alone went).
-- Prepended with queue.lua: waiters take turns (DESIGN.md, "Semaphore"). A queued waiter may
-- take `count` permits when the permits free cover its count and the counts of every live
-- waiter ahead of it (each read from its id: `s<count>-...`, `queue::Role::Permits`; any other
-- id counts as one); a first try (not queued) only when nobody waits, or while the head is
-- within the barging bound. A refusal while the permits free would let the head in publishes
-- them (the head may be asleep on a far re-check), unless a publish woke this attempt (which
-- woke the head too). Redisson's acquires ignore the queue.
-- KEYS[1] the counter `name`, KEYS[2] `{name}:timeout`, KEYS[3..5] the waiter queue (see
-- queue.lua), KEYS[6] this call's latch (one slot).
-- ARGV[1] permits (pool size), ARGV[2] count, ARGV[3] lease ms, ARGV[4] channel
-- `redisson_sc:{name}`, ARGV[5] the latch's PX in ms, ARGV[6] waiter id or '' (a first try),
-- ARGV[7] the waiter's queue lease ms, ARGV[8] barging bound ms, ARGV[9] '1' = sharded pub/sub
-- (SPUBLISH: a Redis Cluster's waiters SSUBSCRIBE the channel, in the name's slot), ARGV[10]
-- '1' = a refusal may wake the head (see above), ARGV[11..] `count` fresh ids, 16 raw bytes.
-- Returns {1, expiry ms} when granted, {0, when to re-check in server ms or -1} when refused
-- (the earliest lease end, or the head's queue lease end when permits are free but it is the
-- head's turn; -1 when there is none; -2 when the name holds a lock, whose end nothing here
-- can see); a `SEMAPHORE_SIZE` error naming both sizes when the stored pool size differs, a
-- `SEMAPHORE_COUNTER` error naming the counter's value when it is no whole number or makes a
-- pool below zero (their codes and words are read by `refusal.rs`).
-- Safe to run twice: a grant is kept in the latch (a re-send must not take permits twice), and
-- after the latch, its ids in the pool; a refusal's re-enqueue keeps the waiter's place.
if ARGV[9] == '1' then
  PUBLISH = 'SPUBLISH'
end
local done = redis.call('GET', KEYS[6])
if done then
  return {1, tonumber(done)}
end
-- A re-send that runs after the latch expired (a node that stalled longer than it lives): our
-- ids, new to this attempt, still in the pool mean that this call ran. The counter has no TTL,
-- so a second DECRBY would shrink the pool for good.
local ours = redis.call('ZSCORE', KEYS[2], ARGV[11])
if ours then
  return {1, tonumber(ours)}
end
local now = clock()
local id = ARGV[6]
local permits, count = tonumber(ARGV[1]), tonumber(ARGV[2])
-- The permits a queued waiter asks for (see above).
local function wants(w)
  return tonumber(string.match(w, '^s(%d+)%-')) or 1
end
-- Refused, with enough permits free for the head: tell it, as a reclaim does (the counter's
-- value). Before, a later waiter for fewer permits took them ahead of it (the rule counted
-- one permit for each waiter ahead), and with the rule fixed, nothing told a head asleep on
-- a far re-check. Only once per waking: a publish that woke this attempt woke the head too.
local function wake(head, available)
  if ARGV[10] == '1' and head and head ~= id and available >= wants(head) then
    redis.call(PUBLISH, ARGV[4], available)
  end
end
local stored_value = redis.call('GET', KEYS[1])
local available = tonumber(stored_value)
if stored_value and available == nil then
  -- Not a counter: the name is held as a lock (a plain lock's token), which counts as held by
  -- someone else, as a hash does for a plain lock. Taken for a new pool, its holder would
  -- lose it to us unheard. Its release publishes nothing a semaphore waiter hears: -2, so
  -- the waiter re-checks at its retry delay, and if it gives up, says why.
  enqueue(id, '', tonumber(ARGV[7]))
  return {0, -2}
end
-- A counter another client set to what INCRBY/DECRBY cannot take ('2e0', ' 2', '2.5', '02',
-- '+2' are numbers to Lua, not to Redis; 16 digits or more lose exactness here): refused
-- naming the value, before any write (a script's error keeps the writes made before it). Our
-- DECRBY failed with Redis's bare "not an integer" error.
local function whole_digits(value)
  return value == '0' and value or string.match(value, '^%-?([1-9]%d*)$')
end
local digits = stored_value and whole_digits(stored_value)
if stored_value and (not digits or #digits > 15) then
  local shown = #stored_value > 40 and string.sub(stored_value, 1, 40) .. '...' or stored_value
  return redis.error_reply('SEMAPHORE_COUNTER semaphore ' .. KEYS[1] .. ': its counter holds "' ..
    shown .. '", not a whole number of free permits')
end
if available == nil then
  -- No counter: a new pool, or one whose counter went while holders' ids stayed (an
  -- operator's DEL, an eviction). The free permits are those the ids do not hold; a full pool
  -- beside them would let holders exceed the permits.
  local taken = redis.call('ZCARD', KEYS[2])
  if taken > permits then
    return redis.error_reply('SEMAPHORE_SIZE semaphore ' .. KEYS[1] .. ' has ' .. taken ..
      ' permits, asked for ' .. permits)
  end
  available = permits - taken
  redis.call('SET', KEYS[1], available)
else
  local held = redis.call('ZCARD', KEYS[2])
  local stored = available + held
  -- Below zero with the holders counted (a counter set by hand; Redisson's addPermits(-n)
  -- leaves one under zero only beside holders): no pool size to compare.
  if stored < 0 then
    return redis.error_reply('SEMAPHORE_COUNTER semaphore ' .. KEYS[1] .. ': its counter holds "' ..
      stored_value .. '" with ' .. held .. ' permits held, a pool below zero')
  end
  if stored ~= permits then
    return redis.error_reply('SEMAPHORE_SIZE semaphore ' .. KEYS[1] .. ' has ' .. stored ..
      ' permits, asked for ' .. permits)
  end
end
local expired = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)
if #expired > 0 then
  for i = 1, #expired, 500 do
    redis.call('ZREM', KEYS[2], unpack(expired, i, math.min(i + 499, #expired)))
  end
  available = redis.call('INCRBY', KEYS[1], #expired)
  -- The counter's new value, as Redisson 4.7.0's reclaim publishes it: up to that many
  -- waiters wake (Redisson's latch releases min(its waiters, the message)).
  if available > 0 then
    redis.call(PUBLISH, ARGV[4], available)
  end
end
if available < count then
  enqueue(id, '', tonumber(ARGV[7]))
  if available > 0 then
    wake(queue_head(), available)
  end
  local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
  return {0, first[2] and tonumber(first[2]) or -1}
end
local head = queue_head()
if head and head ~= id then
  local rank = id ~= '' and redis.call('ZRANK', Q, id)
  local turn = false
  if rank then
    local need = count
    for _, w in ipairs(redis.call('ZRANGE', Q, 0, rank - 1)) do
      need = need + wants(w)
    end
    turn = available >= need
  end
  if not turn and not may_take(head, id, tonumber(ARGV[8])) then
    enqueue(id, '', tonumber(ARGV[7]))
    wake(head, available)
    return {0, now + lease_left(head)}
  end
end
dequeue(id)
local expiry = now + tonumber(ARGV[3])
for i = 11, 10 + count do
  redis.call('ZADD', KEYS[2], expiry, ARGV[i])
end
local left = redis.call('DECRBY', KEYS[1], count)
-- Permits still free with a waiter queued: tell the waiters, as a reclaim does. A manager's
-- waiters share one place, which this grant may have taken out: the next of them, refused
-- behind another manager's waiter, queued again at the back, and when that waiter took its
-- permit nothing told it of the one still free (it slept to its own re-check).
if left > 0 and head and redis.call('ZRANGE', Q, 0, 0)[1] then
  redis.call(PUBLISH, ARGV[4], left)
end
redis.call('SET', KEYS[6], expiry, 'PX', ARGV[5])
return {1, expiry}
