-- Reentrant lock, Redisson's RLock layout: a hash at the key, field "<client uuid>:<owner id>",
-- value = hold count, PEXPIRE on the key. Like Redisson's script: nil on a grant, the key's
-- PTTL when it is busy. Re-entry (our field is there) skips the queue; a first grant takes the
-- queue into account as the plain lock does (Redisson's own clients do not queue).
-- KEYS[1] lock key, KEYS[2] fence counter, KEYS[3] queue, KEYS[4] queue leases, KEYS[5] queue
-- join times (one slot).
-- ARGV[1] ttl ms, ARGV[2] field, ARGV[3] fence mode ('', '1', '0'), ARGV[4] waiter id or '',
-- ARGV[5] queue score or '', ARGV[6] lease ms, ARGV[7] '1' = re-entry only (never a new grant),
-- ARGV[8] barging bound ms; KEYS[6] this hold's mark (`ferrolock:hold:{key}:<hold id>`, the
-- hold id new to this call): set with every grant, for as long as the hold (renewed with it),
-- it is what a release or an undo of this hold takes back (see release_reentrant.lua).
-- A key of another type (a plain lock: redis-py, node-redlock, ferrolock) is held by someone
-- else: HEXISTS fails inside pcall, and the PTTL below makes it a busy answer.
-- Safe to run twice (a re-send after a dropped connection): a fresh grant's owner id is new
-- to this call, so finding our field means this call already ran and granted; a re-entry
-- finds its mark. (Once released, the mark is gone: a re-send delivered after the release
-- adds a count that no handle takes back, which keeps the key until the owner's last release
-- plus a ttl.)
if ARGV[7] == '1' and redis.call('EXISTS', KEYS[6]) == 1 then
  return nil
end
if redis.pcall('HEXISTS', KEYS[1], ARGV[2]) == 1 then
  if ARGV[7] ~= '1' then
    -- Our fresh grant, run again: the same answer, its fence read (no grant since: ours holds).
    return fence_reply(KEYS[2], ARGV[3] == '' and '' or '0')
  end
  redis.call('SET', KEYS[6], '1', 'PX', ARGV[1])
  hold_live(KEYS[6], ARGV[2], ARGV[1])
  redis.call('HINCRBY', KEYS[1], ARGV[2], 1)
  -- Never shorten: the outer handles keep the deadlines their own ttls gave them (-1, no
  -- expiry, is longer than any ttl).
  local left = redis.call('PTTL', KEYS[1])
  if left >= 0 and left < tonumber(ARGV[1]) then
    redis.call('PEXPIRE', KEYS[1], ARGV[1])
  end
  return nil
end
local pttl = redis.call('PTTL', KEYS[1])
local foreign = foreign_type(KEYS[1], pttl)
if foreign then
  return foreign
end
if ARGV[7] == '1' then
  return pttl
end
local id = ARGV[4]
if pttl ~= -2 then
  enqueue(id, ARGV[5], tonumber(ARGV[6]))
  return pttl
end
-- Free. Join first, then look: a waiter that sorts first (arrivals in the same instant, a
-- place kept after an undo) takes the lock now instead of being told to wait for itself.
enqueue(id, ARGV[5], tonumber(ARGV[6]))
local head = queue_head()
if not may_take(head, id, tonumber(ARGV[8])) then
  return lease_left(head)
end
redis.call('HINCRBY', KEYS[1], ARGV[2], 1)
redis.call('PEXPIRE', KEYS[1], ARGV[1])
redis.call('SET', KEYS[6], '1', 'PX', ARGV[1])
hold_live(KEYS[6], ARGV[2], ARGV[1])
dequeue(id)
return fence_reply(KEYS[2], ARGV[3])
