-- Returns this holder's permits (its ids) to the pool on Redisson's RPermitExpirableSemaphore
-- layout (issue 33; sent by `lock.rs`, `release_on`) and publishes how many it returned on
-- `redisson_sc:{name}`, as Redisson's release does, so up to that many waiters wake. Ids
-- already reclaimed (their lease ended) are not returned again.
-- KEYS[1] the counter `name`, KEYS[2] `{name}:timeout`, KEYS[3] this call's latch (one slot).
-- ARGV[1] channel, ARGV[2] the latch's PX in ms, ARGV[3] '1' = sharded pub/sub (SPUBLISH, as
-- Redisson in cluster mode publishes: its waiters SSUBSCRIBE), ARGV[4..] this holder's ids (16
-- raw bytes).
-- Returns how many permits went back (0: none held any more).
-- Safe to run twice: a re-send finds the ids gone (ZREM is 0) and adds nothing; the latch keeps
-- the first run's reply so the re-send answers as it did.
local done = redis.call('GET', KEYS[3])
if done then
  return tonumber(done)
end
-- In slices: `unpack` of thousands of ids at once overflows Lua's stack.
local removed = 0
for i = 4, #ARGV, 500 do
  removed = removed + redis.call('ZREM', KEYS[2], unpack(ARGV, i, math.min(i + 499, #ARGV)))
end
if removed > 0 then
  -- No counter (it went while ids stayed): the next acquire rebuilds it from the ids left; an
  -- INCRBY here would make a pool of this holder's count alone. One another client set to no
  -- whole number (or to a lock's token) is left alone, for the next acquire to name: INCRBY
  -- failed there after the ZREM had run, and the release, done, said it was not.
  local counter = redis.call('TYPE', KEYS[1])['ok'] == 'string' and redis.call('GET', KEYS[1])
  local digits = counter and (counter == '0' and counter or string.match(counter, '^%-?([1-9]%d*)$'))
  if digits and #digits <= 15 then
    redis.call('INCRBY', KEYS[1], removed)
  end
  redis.call(ARGV[3] == '1' and 'SPUBLISH' or 'PUBLISH', ARGV[1], removed)
end
redis.call('SET', KEYS[3], removed, 'PX', ARGV[2])
return removed
