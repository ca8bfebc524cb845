-- Compare-and-delete: release only our own grant, then wake the waiter whose turn it is.
-- Standalone (not prepended with queue.lua), with the queue keys of queue.lua:
-- KEYS[1] lock key, KEYS[2] the waiter queue, KEYS[3] the queue's leases and KEYS[4] its join
-- times; the last key (KEYS[5]) is this release's latch, `ferrolock:latch:{key}:<token>`.
-- With nobody queued the queue costs one EXISTS. The client always sends the five: sent with
-- the lock, the queue and the latch alone (when the releasing client had seen no contention
-- lately), the release told the first waiter without dropping lapsed ones first, a crashed
-- waiter heard it, and the live one behind it slept on its timer (found by a review).
-- ARGV[1] our token; ARGV[2] the prefix of the waiters' own channels; ARGV[3] '1' = sharded
-- pub/sub (SPUBLISH: the channel is in the key's slot); ARGV[4] the latch's PX in ms; with
-- five keys, ARGV[5] the barging bound in ms, or 0: a head queued for less than that is not
-- told (a quiet release by a worker in a loop; see DESIGN.md, "Quiet streaks").
-- Returns 0 (not ours), 1 (released), 2 (released, and waiters are queued: contention, which
-- makes this client's next attempt on the key respect the waiter queue), 3 (released quietly:
-- waiters are queued, the first was not told).
-- A key of another type (a reentrant lock's hash) is someone else's: pcall turns WRONGTYPE
-- into a mismatch, at no extra call.
-- Safe to run twice (a re-send after a dropped connection): the latch, set with the delete,
-- keeps this release's reply (1, 2 or 3), and a second run that finds no token answers it, as
-- the first did, where the key alone would say "not ours" (and tells no head again).
local latch = KEYS[#KEYS]
if redis.pcall('GET', KEYS[1]) ~= ARGV[1] then
  return tonumber(redis.call('GET', latch) or '0')
end
redis.call('DEL', KEYS[1])
if redis.call('EXISTS', KEYS[2]) == 0 then
  redis.call('SET', latch, '1', 'PX', ARGV[4])
  return 1
end
local now
if #KEYS >= 5 then
  -- Waiters whose lease ended are dropped first (as queue_head() does), so that the wake-up
  -- goes to a live one.
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local gone = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now)
  if #gone > 0 then
    for _, w in ipairs(gone) do
      redis.call('ZREM', KEYS[2], w)
      redis.call('ZREM', KEYS[4], w)
    end
    redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
  end
end
local head = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
if not head then
  redis.call('SET', latch, '2', 'PX', ARGV[4])
  return 2
end
if now then
  -- The releasing process's next attempt may take it back during a grace after the bound
  -- (the `quiet` argument of acquire.lua), so it cannot find a free lock promised to a head
  -- that nobody told.
  local bound = tonumber(ARGV[5])
  local since = bound > 0 and redis.call('ZSCORE', KEYS[4], head)
  if since and now - tonumber(since) < bound then
    redis.call('SET', latch, '3', 'PX', ARGV[4])
    return 3
  end
end
redis.call('SET', latch, '2', 'PX', ARGV[4])
redis.call(ARGV[3] == '1' and 'SPUBLISH' or 'PUBLISH', ARGV[2] .. head, '0')
return 2
