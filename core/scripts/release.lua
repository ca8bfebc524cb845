-- Compare-and-delete: release only our own grant, then wake the waiter whose turn it is.
-- Prepended with queue.lua. KEYS[1] lock key, KEYS[2] unused (the fence counter: same slot),
-- KEYS[3..5] the waiter queue (see queue.lua).
-- ARGV[1] our token; ARGV[2] the prefix of the waiters' own channels.
-- Returns 0 (not ours), 1 (released), 2 (released, and a waiter is queued: contention, which
-- makes this client's next attempt on the key respect the waiter queue).
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  if wake_head(ARGV[2], '0') == 1 then
    return 2
  end
  return 1
end
return 0
