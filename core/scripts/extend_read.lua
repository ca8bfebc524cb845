-- A reader's renewal: its own hold keys, its hold's mark and the hash, each only upward (never
-- shorter: the other readers' deadlines follow the hash, and every handle of this owner shares
-- the hold keys, numbered, not named per handle: a short re-entry's renewal once cut the outer
-- hold's key, which then lapsed under it). Answers like the other renewals, so the watchdog's
-- batch reads it the same way.
-- KEYS[1] lock key, KEYS[2] our timeout prefix, KEYS[3] the renewing hold's mark (see
-- acquire_reentrant.lua), KEYS[4] the owner's set of live read holds (see holds.lua; named
-- for a split slot, as in extend_reentrant.lua) (one slot); ARGV[1] field, ARGV[2] ttl ms.
-- Returns 1 when renewed, 0 when we hold no read lock (also for a key of another type), and 0
-- when the renewing hold lapsed here (its mark expired, or every hold key of ours did: we
-- missed our renewals on this node, while another reader kept the hash and our field alive);
-- then nothing is re-created or raised. A gap in our hold keys' numbers alone is not a lapse
-- of this hold: the keys are shared by the owner's holds, and a sibling hold that lapsed
-- leaves one (a gap once declared a live hold lost: found by a review). A live mark has a
-- live hold key behind it (each renewal raises every key to at least the mark's expiry, and
-- a release raises the keys left to the one it drops); a gap is left as it is. Safe to run
-- twice: a second run finds the same keys.
local count = tonumber(redis.pcall('HGET', KEYS[1], ARGV[1]))
-- Without our mark, our hold has no count here (see extend_reentrant.lua): not renewed.
if not count or redis.call('EXISTS', KEYS[3]) == 0 then
  return 0
end
-- No hold key of ours at all: the owner's holds lapsed here (the mark alone cannot be).
local alive = false
for i = 1, count do
  if redis.call('EXISTS', KEYS[2] .. ':' .. i) == 1 then
    alive = true
    break
  end
end
if not alive then
  return 0
end
-- Raises only what exists (a gap's PTTL is -2).
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
hold_live(KEYS[3], ARGV[1], ARGV[2])
return 1
