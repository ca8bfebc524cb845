-- Read lock, Redisson's RReadWriteLock layout: the hash at the key holds `mode` ('read' or
-- 'write'), a field "<client uuid>:<owner id>" per reader with its hold count, and the writer's
-- "<field>:write". Each read hold n has its own key `<timeout prefix>:<n>` ("{name}:<field>:
-- rwlock_timeout:<n>", Redisson's) whose TTL is that hold's lease. Like Redisson's script: nil
-- on a grant, the key's PTTL when it is busy.
-- KEYS[1] lock key, KEYS[2] fence counter (unused: fences go to writers), KEYS[3] queue,
-- KEYS[4] queue leases, KEYS[5] queue join times, KEYS[6] our timeout prefix, KEYS[7] this
-- hold's mark (`ferrolock:hold:{key}:<hold id>`; see acquire_reentrant.lua) (one slot).
-- ARGV[1] ttl ms, ARGV[2] field, ARGV[3] unused, ARGV[4] waiter id or '', ARGV[5] queue score
-- or '', ARGV[6] lease ms, ARGV[7] '1' = re-entry only (our read or write hold is live),
-- ARGV[8] barging bound ms, ARGV[9] '1' = a grant keeps our place in the queue (more readers of
-- this process wait: they attempt next, and share the key, ahead of a writer that queued after
-- them; taken out, they queued again behind it and waited for its whole hold).
-- Busy: write-held by another owner, a plain lock, or a hash without `mode` (a reentrant
-- lock's).
-- Granted: the hash is free; or it is read-held and no ferrolock writer waits ahead of us (a
-- queued writer is served before readers that queued after it: no reader starves it); or we
-- hold it (a re-entry, or a read under our own write hold: the downgrade). A reader's waiter
-- id starts with 'r', a writer's with 'w': every reader at the front of the queue may take it.
-- Never shortens the hash: other readers' deadlines follow it.
-- Safe to run twice: every grant adds a hold (a count and a key) and its mark, and a re-send
-- of the same call (same hold id) finds the mark and answers nil without adding another.
if redis.call('EXISTS', KEYS[7]) == 1 then
  return nil
end
local pttl = redis.call('PTTL', KEYS[1])
local foreign = foreign_type(KEYS[1], pttl)
if foreign then
  return foreign
end
local mode = pttl ~= -2 and redis.pcall('HGET', KEYS[1], 'mode') or false
if type(mode) == 'table' then
  -- A plain lock (a string): someone else's.
  return pttl
end
-- A hash without `mode` is a reentrant lock (Redisson's RLock layout: the owner's field, no
-- mode): someone else's, busy as a write hold is. Taken for free, a read hold written into it
-- would make the next read release take the owner's field for a crashed reader's and delete it.
local foreign_hash = pttl ~= -2 and not mode
local ours = mode and (redis.call('HEXISTS', KEYS[1], ARGV[2]) == 1
  or redis.call('HEXISTS', KEYS[1], ARGV[2] .. ':write') == 1)
local id = ARGV[4]
if not ours then
  if ARGV[7] == '1' or mode == 'write' or foreign_hash then
    if ARGV[7] ~= '1' then
      enqueue(id, ARGV[5], tonumber(ARGV[6]))
    end
    return pttl
  end
  -- Free or read-held: join, then look at who is ahead of us.
  enqueue(id, ARGV[5], tonumber(ARGV[6]))
  local head = queue_head()
  if head and head ~= id and not may_take(head, id, tonumber(ARGV[8])) then
    local ahead = id ~= '' and redis.call('ZRANK', Q, id)
    local queued = redis.call('ZRANGE', Q, 0, ahead and (ahead - 1) or -1)
    for _, w in ipairs(queued) do
      if string.sub(w, 1, 1) ~= 'r' then
        -- A writer waits ahead of us: it goes first.
        if pttl == -2 then
          return lease_left(head)
        end
        return pttl
      end
    end
  end
end
redis.call('SET', KEYS[7], '1', 'PX', ARGV[1])
hold_live(KEYS[7], ARGV[2], ARGV[1])
if not mode then
  redis.call('HSET', KEYS[1], 'mode', 'read')
end
local n = redis.call('HINCRBY', KEYS[1], ARGV[2], 1)
redis.call('SET', KEYS[6] .. ':' .. n, '1', 'PX', ARGV[1])
-- A hash created here has no expiry yet; an existing one's is only raised (-1, a hash
-- someone left without one, is longer than any ttl).
local left = redis.call('PTTL', KEYS[1])
if not mode or (left >= 0 and left < tonumber(ARGV[1])) then
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
end
if ARGV[9] ~= '1' then
  dequeue(id)
end
return nil
