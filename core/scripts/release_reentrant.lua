-- Redisson's unlock: decrement our hold count; the last release deletes the key and publishes
-- "0" on the Redisson channel. A field that is not ours (another owner), or a key of another
-- type (a plain lock; pcall keeps WRONGTYPE out), is never touched.
-- While the count stays above 0 the key is never shortened (as in extend_reentrant.lua): the
-- handles still live computed their deadlines from their own ttls.
-- KEYS[1] lock key, KEYS[2] this call's latch (`ferrolock:latch:{key}:<call id>`, as
-- Redisson's unlock latch since 3.24.1); ARGV[1] field, ARGV[2] ttl ms, ARGV[3] channel (same
-- hash slot), ARGV[4] '1' = sharded pub/sub: SPUBLISH, as Redisson in cluster mode publishes
-- (its shardedSubscriptionMode), ARGV[5] the latch's PX in ms; KEYS[3] this hold's mark
-- (`ferrolock:hold:{key}:<hold id>`, see acquire_reentrant.lua).
-- Returns nil when the field is not there (or this hold has no mark here: then, with no live
-- hold of ours left here, the key is freed too), 0 when still held (another hold of ours is
-- live: see holds.lua), 1 when released.
-- The count is taken only with this hold's mark: the handles of one owner share the field,
-- and a count this hold never added here (its grant never reached this node, its lease ran
-- out, or an earlier run of this release took it) belongs to another handle; taken, it would
-- free the lock under that handle. So a re-send, however late it runs, takes nothing twice.
-- The reply is kept in the latch, so that a re-send soon after answers as the first run did
-- (one after it expired answers nil, having taken nothing).
local done = redis.call('GET', KEYS[2])
if done then
  return tonumber(done)
end
if redis.pcall('HEXISTS', KEYS[1], ARGV[1]) ~= 1 then
  return nil
end
-- Not ours to release, as a lapsed lock's ("still held" made a lapsed re-entry's release
-- say it was released in time).
if redis.call('DEL', KEYS[3]) == 0 then
  -- No hold of ours is live here either (the others were released, or lapsed too): the count
  -- is nobody's, and kept, it held the key with nobody holding it for the rest of the hash's
  -- ttl (an outer hold's, released before this shorter one lapsed). Freed, still answering nil.
  local holds, _, prefix = hold_names(KEYS[3], ARGV[1])
  if not any_live(holds, prefix) then
    redis.call('DEL', KEYS[1])
    redis.call(ARGV[4] == '1' and 'SPUBLISH' or 'PUBLISH', ARGV[3], '0')
  end
  return nil
end
local count = redis.call('HINCRBY', KEYS[1], ARGV[1], -1)
-- A count left with no live hold of ours behind it (holds whose leases ran out) is nobody's:
-- kept, it held the key with nobody holding it for a ttl. Released as the last hold.
local live = others_live(KEYS[3], ARGV[1])
if count > 0 and live then
  local left = redis.call('PTTL', KEYS[1])
  if left >= 0 and left < tonumber(ARGV[2]) then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
  end
  redis.call('SET', KEYS[2], '0', 'PX', ARGV[5])
  return 0
end
redis.call('DEL', KEYS[1])
redis.call(ARGV[4] == '1' and 'SPUBLISH' or 'PUBLISH', ARGV[3], '0')
redis.call('SET', KEYS[2], '1', 'PX', ARGV[5])
return 1
