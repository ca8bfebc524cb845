-- Plain lock: SET key token NX PX ttl (the layout of redis-py's Lock and node-redlock), granted
-- to the first queued waiter, to anyone when nobody is queued, or to anyone while the first
-- waiter has been queued for less than the barging bound; plus the fence counter.
-- KEYS[1] lock key, KEYS[2] fence counter, KEYS[3] queue, KEYS[4] queue leases, KEYS[5] queue
-- join times (one slot).
-- ARGV[1] token, ARGV[2] ttl ms, ARGV[3] fence mode ('', '1', '0'), ARGV[4] waiter id or '',
-- ARGV[5] queue score or '', ARGV[6] lease ms, ARGV[7] barging bound ms, ARGV[8] the prefix of
-- the waiters' own channels ('' = none; see wake_head).
-- Returns nil on a grant ({counter} with fencing); otherwise the ms after which a re-check is
-- worth it: the holder's PTTL (-1: it has none), or the lease left to the waiter whose turn it
-- is.
local id = ARGV[4]
local pttl = redis.call('PTTL', KEYS[1])
local prefix = ARGV[8] or ''
if pttl ~= -2 then
  enqueue(id, ARGV[5], tonumber(ARGV[6]))
  return pttl
end
-- Free. Join first, then look: a waiter that sorts first (arrivals in the same instant, a
-- place kept after an undo) takes the lock now instead of being told to wait for itself.
enqueue(id, ARGV[5], tonumber(ARGV[6]))
local head = queue_head()
if not may_take(head, id, tonumber(ARGV[7])) then
  if pruned then
    -- A lapsed head was dropped and the lock is free: the new head re-checks now.
    wake_head(prefix, 'q')
  end
  return lease_left(head)
end
-- A grant needs no announcement: the lock is held now, and its release wakes the new head.
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
dequeue(id)
return fence_reply(KEYS[2], ARGV[3])
