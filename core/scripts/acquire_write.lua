-- Write lock, Redisson's RReadWriteLock layout (see acquire_read.lua): the writer's field is
-- "<client uuid>:<owner id>:write" with its hold count. Like Redisson's script: nil (or the
-- fence) on a grant, the key's PTTL when it is busy.
-- KEYS[1] lock key, KEYS[2] fence counter, KEYS[3] queue, KEYS[4] queue leases, KEYS[5] queue
-- join times, KEYS[6] this hold's mark (`ferrolock:hold:{key}:<hold id>`; see
-- acquire_reentrant.lua) (one slot).
-- ARGV[1] ttl ms, ARGV[2] the writer's field ("<field>:write"), ARGV[3] fence mode ('', '1',
-- '0'), ARGV[4] waiter id or '', ARGV[5] queue score or '', ARGV[6] lease ms, ARGV[7] '1' =
-- re-entry only, ARGV[8] barging bound ms, ARGV[9] unused, ARGV[10] the reader's field
-- ("<field>").
-- A read→write upgrade (our reader field is there, our writer field is not) is refused with
-- an `RWLOCK_UPGRADE` error reply (read by `refusal.rs`): two upgraders would each wait for the
-- other's read hold forever.
-- Safe to run twice: a fresh grant's owner id is new to this call, so finding our field means
-- this call already ran and granted; a re-entry finds its mark.
if ARGV[7] == '1' and redis.call('EXISTS', KEYS[6]) == 1 then
  return nil
end
local pttl = redis.call('PTTL', KEYS[1])
local foreign = foreign_type(KEYS[1], pttl)
if foreign then
  return foreign
end
if pttl ~= -2 and redis.pcall('HEXISTS', KEYS[1], ARGV[2]) == 1 then
  if ARGV[7] ~= '1' then
    return fence_reply(KEYS[2], ARGV[3] == '' and '' or '0')
  end
  redis.call('SET', KEYS[6], '1', 'PX', ARGV[1])
  hold_live(KEYS[6], ARGV[2], ARGV[1])
  redis.call('HINCRBY', KEYS[1], ARGV[2], 1)
  local left = redis.call('PTTL', KEYS[1])
  if left >= 0 and left < tonumber(ARGV[1]) then
    redis.call('PEXPIRE', KEYS[1], ARGV[1])
  end
  return nil
end
if pttl ~= -2 and redis.pcall('HEXISTS', KEYS[1], ARGV[10]) == 1 then
  return redis.error_reply('RWLOCK_UPGRADE ' .. KEYS[1] .. ': this owner holds its read lock; '
    .. 'a read->write upgrade is refused (two upgraders would wait for each other forever): '
    .. 'release the read lock first')
end
if ARGV[7] == '1' then
  return pttl
end
local id = ARGV[4]
enqueue(id, ARGV[5], tonumber(ARGV[6]))
if pttl ~= -2 then
  return pttl
end
local head = queue_head()
if not may_take(head, id, tonumber(ARGV[8])) then
  return lease_left(head)
end
redis.call('HSET', KEYS[1], 'mode', 'write', ARGV[2], 1)
redis.call('PEXPIRE', KEYS[1], ARGV[1])
redis.call('SET', KEYS[6], '1', 'PX', ARGV[1])
hold_live(KEYS[6], ARGV[2], ARGV[1])
dequeue(id)
return fence_reply(KEYS[2], ARGV[3])
