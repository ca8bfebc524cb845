-- A process's last waiter on a key left without the lock: take its id out of the queue and,
-- when the lock is free, tell the waiter whose turn it is now (it may have been us).
-- Prepended with queue.lua. KEYS[1] lock key, KEYS[2] unused (fence counter: same slot),
-- KEYS[3..5] the waiter queue.
-- ARGV[1] waiter id; ARGV[2] the prefix of the waiters' own channels ('' = none: a counted
-- lock); ARGV[3] '1' = sharded pub/sub (SPUBLISH); ARGV[4] a counted lock's channel, where every
-- waiter listens (Redisson's, '' for a plain lock).
-- A counted lock's waiters have no channel of their own: when the head leaves a free lock, the
-- next one was told "not your turn" at the release and would sleep on its timer, so all hear
-- Redisson's unlock message ('0') and re-check.
if ARGV[3] == '1' then
  PUBLISH = 'SPUBLISH'
end
dequeue(ARGV[1])
if redis.call('EXISTS', KEYS[1]) == 0 and wake_head(ARGV[2], '?') == 0 and ARGV[4] ~= ''
    and queue_head() then
  redis.call(PUBLISH, ARGV[4], '0')
end
return 1
