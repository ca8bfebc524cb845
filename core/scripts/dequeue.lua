-- A process's last waiter on a key left without the lock: take its id out of the queue and,
-- when the lock is free, tell the waiter whose turn it is now (it may have been us).
-- Prepended with queue.lua. KEYS[1] lock key, KEYS[2] unused (fence counter: same slot),
-- KEYS[3..5] the waiter queue.
-- ARGV[1] waiter id; ARGV[2] the prefix of the waiters' own channels ('' = none: reentrant);
-- ARGV[3] '1' = sharded pub/sub (SPUBLISH).
if ARGV[3] == '1' then
  PUBLISH = 'SPUBLISH'
end
dequeue(ARGV[1])
if redis.call('EXISTS', KEYS[1]) == 0 then
  wake_head(ARGV[2], '?')
end
return 1
