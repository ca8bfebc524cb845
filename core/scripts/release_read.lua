-- Redisson's read unlock: one hold fewer (its count, and its timeout key). The last hold of the
-- last reader deletes the hash and publishes "0" on Redisson's channel; so does a release that
-- finds every other reader's timeout keys expired (crashed readers), as Redisson's does.
-- Like Redisson's, it sets a hash still read-held to the longest hold key left, which
-- outlives every live reader's deadline.
-- KEYS[1] lock key, KEYS[2] this call's latch, KEYS[3] our timeout prefix, KEYS[4] the prefix
-- of every reader's timeout keys ("{name}" or the name with a '{') (one slot).
-- ARGV[1] field, ARGV[2] unused, ARGV[3] channel, ARGV[4] '1' = SPUBLISH, ARGV[5] the latch's
-- PX in ms; KEYS[5] this hold's mark (see release_reentrant.lua: the count is taken only with
-- it).
-- Returns nil when we hold no read lock (or this hold lapsed: then, with no live read hold of
-- ours left here, our field and hold keys go too, and the key when nobody else holds it), 0
-- when the key is still held, 1 when released.
-- Safe to run twice, however late: the mark is taken once (a decrement run twice would drop a
-- hold of a live handle); the reply is kept in the latch (a re-send run after it expired
-- finds no mark and answers nil, having taken nothing).
local done = redis.call('GET', KEYS[2])
if done then
  return tonumber(done)
end
-- Whether the key stays held once our hold is out of it: by a writer (ours: the downgrade),
-- or by a reader with a live hold key. Otherwise (crashed readers' fields alone) it is
-- deleted and "0" published, as Redisson's read unlock does. Read-held, the hash goes with its
-- longest hold key left (`keep_for_read_holds`).
local function held_by_others()
  if redis.call('HLEN', KEYS[1]) > 1 then
    if redis.call('HGET', KEYS[1], 'mode') == 'write' then
      return true
    end
    if keep_for_read_holds(KEYS[1], KEYS[4]) then
      return true
    end
  end
  redis.call('DEL', KEYS[1])
  redis.call(ARGV[4] == '1' and 'SPUBLISH' or 'PUBLISH', ARGV[3], '0')
  return false
end

if redis.pcall('HEXISTS', KEYS[1], ARGV[1]) ~= 1 then
  return nil
end
-- Without its mark this hold has no count here (its lease ran out, or its grant never reached
-- this node); the owner's field is another hold's: not ours to release, as a lapsed lock's.
-- (0, "still held", made its caller's release say that this hold was released in time.)
if redis.call('DEL', KEYS[5]) == 0 then
  -- No read hold of ours is live here either (the others were released, or lapsed too): our
  -- count is nobody's, and kept, with a hold key an earlier release raised to its own lease,
  -- it held the key read-held with nobody holding it for the rest of that lease (every writer
  -- waited). Our field and keys go, and the key with them when nobody else holds it; still nil.
  local holds, _, prefix = hold_names(KEYS[5], ARGV[1])
  if not any_live(holds, prefix) then
    local count = tonumber(redis.call('HGET', KEYS[1], ARGV[1])) or 0
    redis.call('HDEL', KEYS[1], ARGV[1])
    for i = 1, count do
      redis.call('DEL', KEYS[3] .. ':' .. i)
    end
    held_by_others()
  end
  return nil
end
local count = redis.call('HINCRBY', KEYS[1], ARGV[1], -1)
-- A count left with no live read hold of ours behind it (holds whose leases ran out) is
-- nobody's (see holds.lua): released with its hold keys, as the last hold.
if not others_live(KEYS[5], ARGV[1]) and count > 0 then
  for i = 2, count + 1 do
    redis.call('DEL', KEYS[3] .. ':' .. i)
  end
  count = 0
end
if count <= 0 then
  redis.call('HDEL', KEYS[1], ARGV[1])
end
-- The hold keys are numbered, not named per handle: the last one goes, and the ones left live
-- at least as long as it did (it may have been another handle's, renewed for longer). When the
-- last is gone already (a shorter hold of ours lapsed: its key expired, its count stayed), the
-- last one left goes instead: kept, it held the key read-held for its ttl with no hold behind
-- it. Each live hold keeps a key (renewals raise them all), so one is left for each.
local n = count + 1
while n > 1 and redis.call('EXISTS', KEYS[3] .. ':' .. n) == 0 do
  n = n - 1
end
local last = KEYS[3] .. ':' .. n
local lease = redis.call('PTTL', last)
redis.call('DEL', last)
for i = 1, count do
  local left = redis.call('PTTL', KEYS[3] .. ':' .. i)
  if left >= 0 and left < lease then
    redis.call('PEXPIRE', KEYS[3] .. ':' .. i, lease)
  end
end
local handed = false
if redis.call('HGET', KEYS[1], 'mode') == 'write'
    and redis.call('HEXISTS', KEYS[1], ARGV[1] .. ':write') == 1 then
  -- A read under a write hold is its writer's (the downgrade). A write count with no live
  -- write hold behind it (its lease ran out unrenewed) is nobody's: kept, it held the key
  -- write-held with nobody holding it for the hash's ttl. The key goes to the read holds left,
  -- as a write release hands it (see holds.lua).
  local holds, _, prefix = hold_names(KEYS[5], ARGV[1] .. ':write')
  if not any_live(holds, prefix) then
    redis.call('HDEL', KEYS[1], ARGV[1] .. ':write')
    redis.call('HSET', KEYS[1], 'mode', 'read')
    handed = true
  end
end
if held_by_others() then
  if handed then
    redis.call(ARGV[4] == '1' and 'SPUBLISH' or 'PUBLISH', ARGV[3], '1')
  end
  redis.call('SET', KEYS[2], '0', 'PX', ARGV[5])
  return 0
end
redis.call('SET', KEYS[2], '1', 'PX', ARGV[5])
return 1
