-- A reader's renewal: its own hold keys, its hold's mark and the hash, each only upward (never
-- shorter: the other readers' deadlines follow the hash, and every handle of this owner shares
-- the hold keys, numbered, not named per handle: a short re-entry's renewal once cut the outer
-- hold's key, which then lapsed under it). Answers like the other renewals, so the watchdog's
-- batch reads it the same way.
-- KEYS[1] lock key, KEYS[2] our timeout prefix, KEYS[3] the renewing hold's mark (see
-- acquire_reentrant.lua) (one slot); ARGV[1] field, ARGV[2] ttl ms.
-- Returns 1 when renewed, 0 when we hold no read lock (also for a key of another type), and 0
-- when any of our hold keys 1..count has expired here (we missed our renewals on this node,
-- while another reader kept the hash and our field alive): that hold lapsed on this node, so
-- it is not renewed, and nothing is re-created or raised (neither our other hold keys nor the
-- hash). Safe to run twice: a second run finds the same keys.
local count = tonumber(redis.pcall('HGET', KEYS[1], ARGV[1]))
-- Without our mark, our hold has no count here (see extend_reentrant.lua): not renewed.
if not count or redis.call('EXISTS', KEYS[3]) == 0 then
  return 0
end
for i = 1, count do
  if redis.call('EXISTS', KEYS[2] .. ':' .. i) == 0 then
    return 0
  end
end
local function raise(name)
  local left = redis.call('PTTL', name)
  if left >= 0 and left < tonumber(ARGV[2]) then
    redis.call('PEXPIRE', name, ARGV[2])
  end
end
for i = 1, count do
  raise(KEYS[2] .. ':' .. i)
end
raise(KEYS[3])
raise(KEYS[1])
return 1
