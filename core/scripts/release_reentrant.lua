-- Redisson's unlock: decrement our hold count; the last release deletes the key and publishes
-- "0" on the Redisson channel. A field that is not ours (another owner), or a key of another
-- type (a plain lock; pcall keeps WRONGTYPE out), is never touched.
-- While the count stays above 0 the key is never shortened (as in extend_reentrant.lua): the
-- handles still live computed their deadlines from their own ttls.
-- KEYS[1] lock key, KEYS[2] this call's latch (`ferrolock:latch:{key}:<call id>`, as
-- Redisson's unlock latch since 3.24.1); ARGV[1] field, ARGV[2] ttl ms, ARGV[3] channel (same
-- hash slot), ARGV[4] '1' = sharded pub/sub: SPUBLISH, as Redisson in cluster mode publishes
-- (its shardedSubscriptionMode), ARGV[5] the latch's PX in ms.
-- Returns nil when the field is not there, 0 when still held (count > 0), 1 when released.
-- A decrement run twice would free the lock under a live handle: the reply is kept in the
-- latch, and a re-send of the same call (same id) gets it back without decrementing again.
local done = redis.call('GET', KEYS[2])
if done then
  return tonumber(done)
end
if redis.pcall('HEXISTS', KEYS[1], ARGV[1]) ~= 1 then
  return nil
end
local count = redis.call('HINCRBY', KEYS[1], ARGV[1], -1)
if count > 0 then
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
