-- Plain lock: SET key token NX PX ttl (the layout of redis-py's Lock and node-redlock), granted
-- to the first queued waiter, to anyone when nobody is queued, or to anyone while the first
-- waiter has been queued for less than the barging bound; plus the fence counter.
-- KEYS[1] lock key, KEYS[2] fence counter, KEYS[3] queue, KEYS[4] queue leases, KEYS[5] queue
-- join times (one slot).
-- ARGV[1] token, ARGV[2] ttl ms, ARGV[3] fence mode ('', '1', '0'), ARGV[4] waiter id or '',
-- ARGV[5] queue score or '', ARGV[6] lease ms, ARGV[7] barging bound ms, ARGV[8] the prefix of
-- the waiters' own channels ('' = none; see wake_head), ARGV[9] the grace after the bound in ms
-- (see recheck(); 0 with N nodes, whose releases are never quiet), ARGV[10] '1' when the caller's last act on the key was a quiet release: it
-- may take the lock back until the head's bound + grace, ARGV[11] '1' = sharded pub/sub (SPUBLISH).
-- Safe to run twice (a re-send after a dropped connection): finding our own token is our grant.
-- Returns nil on a grant ({counter} with fencing); otherwise the ms after which a re-check is
-- worth it: the holder's PTTL (-1: it has none), or the lease left to the waiter whose turn it
-- is, cut to the end of our own barging bound while we are within it (see recheck()).
if ARGV[11] == '1' then
  PUBLISH = 'SPUBLISH'
end
local id = ARGV[4]
local pttl = redis.call('PTTL', KEYS[1])
local foreign = foreign_type(KEYS[1], pttl)
if foreign then
  return foreign
end
local prefix = ARGV[8] or ''
local bound, grace = tonumber(ARGV[7]), tonumber(ARGV[9])
-- Releases may be quiet (one node: grace > 0): a waiter re-checks when its bound ends.
local function hint(ms)
  if grace > 0 then
    return recheck(ms, id, bound)
  end
  return ms
end
if pttl ~= -2 then
  if redis.pcall('GET', KEYS[1]) == ARGV[1] then
    -- Our own grant: this call ran already (a re-send after a dropped connection). The same
    -- answer, its fence read (no grant since: ours holds).
    dequeue(id)
    return fence_reply(KEYS[2], ARGV[3] == '' and '' or '0')
  end
  enqueue(id, ARGV[5], tonumber(ARGV[6]))
  return hint(pttl)
end
local barge = ARGV[10] == '1' and bound + grace or bound
local head
local queued = false
if ARGV[5] == '' and (id == '' or not redis.call('ZSCORE', Q, id)) then
  -- Free, and we are not queued, in arrival order (one node): we would join at the back, so
  -- we may take the lock only when nobody is queued or by barging. Look first, and join only
  -- to wait (a streak's barge then costs no queue writes).
  head = queue_head()
else
  -- Free. Join first, then look: a waiter that sorts first (arrivals in the same instant, a
  -- place kept after an undo) takes the lock now instead of being told to wait for itself.
  enqueue(id, ARGV[5], tonumber(ARGV[6]))
  queued = true
  head = queue_head()
end
if not may_take(head, id, barge) then
  if not queued then
    enqueue(id, ARGV[5], tonumber(ARGV[6]))
  end
  if pruned or ARGV[10] == '1' then
    -- The lock is free and it is the head's turn, but nobody told it: a lapsed head was
    -- dropped, or our own release was quiet and we came back too late to take it back.
    wake_head(prefix, 'q')
  end
  return hint(lease_left(head))
end
-- A grant needs no announcement: the lock is held now, and its release wakes the new head.
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
if queued then
  dequeue(id)
end
return fence_reply(KEYS[2], ARGV[3])
