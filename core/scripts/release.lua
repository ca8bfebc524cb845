-- Compare-and-delete: release only our own grant, then wake waiters.
-- KEYS[1] lock key; ARGV[1] our token; ARGV[2] the release channel (same hash slot as the key).
-- Returns 0 (not ours), 1 (released), 2 (released, and someone was listening: contention,
-- which makes this client's next attempt on the key respect the waiter queue).
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  if redis.call('PUBLISH', ARGV[2], '0') > 0 then
    return 2
  end
  return 1
end
return 0
