-- A process's last waiter on a key left without the lock: take its id out of the queue and,
-- when the lock is free, tell the waiter whose turn it is now (it may have been us).
-- Prepended with queue.lua. KEYS[1] lock key, KEYS[2] unused (fence counter: same slot),
-- KEYS[3..5] the waiter queue.
-- ARGV[1] waiter id; ARGV[2] the prefix of the waiters' own channels ('' = none: a counted
-- lock); ARGV[3] '1' = sharded pub/sub (SPUBLISH); ARGV[4] a counted lock's channel, where every
-- waiter listens (Redisson's, '' for a plain lock).
-- A counted lock's waiters have no channel of their own: when the head leaves a free lock, the
-- next one was told "not your turn" at the release and would sleep on its timer, so all hear
-- Redisson's unlock message ('0') and re-check. A read-write lock that readers hold is open to
-- a reader at the head too: a reader queued behind a writer that left waited for its own
-- re-check, up to the hash's PTTL; and a semaphore with free permits to whoever is next.
if ARGV[3] == '1' then
  PUBLISH = 'SPUBLISH'
end
dequeue(ARGV[1])
local free = redis.call('EXISTS', KEYS[1]) == 0
if free and wake_head(ARGV[2], '?') == 1 then
  return 1
end
if ARGV[4] ~= '' then
  local head = queue_head()
  if head and (free or (string.sub(head, 1, 1) == 'r'
      and redis.pcall('HGET', KEYS[1], 'mode') == 'read')) then
    redis.call(PUBLISH, ARGV[4], '0')
  elseif head and string.sub(ARGV[4], 1, 12) == 'redisson_sc:' then
    -- A semaphore's counter stays (it goes only when an operator or an eviction takes it;
    -- then the branch above tells every waiter, and the next acquire rebuilds it): with
    -- permits free, the counter's value, as a reclaim publishes it (Redisson's waiters wake
    -- up to that many).
    local available = tonumber(redis.pcall('GET', KEYS[1]))
    if available and available > 0 then
      redis.call(PUBLISH, ARGV[4], available)
    end
  end
end
return 1
