-- Redisson's renewal: compare-field-and-pexpire. Never re-creates an expired or foreign lock.
-- Unlike Redisson's, it never shortens the key: every handle of one acquisition shares the
-- key and computed its deadline from its own ttl, so the key lives to the latest of them
-- (-1, no expiry, counts as the latest). A plain key's extend never shortens it either.
-- KEYS[1] lock key, KEYS[2] the renewing hold's mark (`ferrolock:hold:{key}:<hold id>`, see
-- acquire_reentrant.lua: it lives as long as the hold, never re-created), KEYS[3] the
-- owner's set of live holds (`ferrolock:holds:{key}:<field>`, see holds.lua); ARGV[1] field;
-- ARGV[2] ttl ms. The set is named here, though `hold_live` finds it from the mark, because
-- the renewal is the one script that runs while the key's slot is split between two
-- primaries: named, a set left on the other side makes the request TRYAGAIN; unnamed, the
-- renewal ran where the key and mark had moved and made a second set there, which the
-- set's own MIGRATE then met (BUSYKEY: the reshard stopped). Returns 1 when renewed, 0 otherwise (also for a key of another type: a plain
-- lock is someone else's, and pcall keeps WRONGTYPE out).
-- Renewed only where this hold has its count (its mark): the owner's field alone may be
-- another handle's count (a re-entry that missed this node), and counting it would keep this
-- handle's validity going on nodes that hold nothing of it.
if redis.pcall('HEXISTS', KEYS[1], ARGV[1]) == 1 and redis.call('EXISTS', KEYS[2]) == 1 then
  for i = 1, #KEYS do
    local left = redis.call('PTTL', KEYS[i])
    if left >= 0 and left < tonumber(ARGV[2]) then
      redis.call('PEXPIRE', KEYS[i], ARGV[2])
    end
  end
  hold_live(KEYS[2], ARGV[1], ARGV[2])
  return 1
end
return 0
