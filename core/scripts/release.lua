-- Compare-and-delete: release only our own grant, then wake waiters.
-- KEYS[1] lock key; ARGV[1] our token; ARGV[2] release channel (same hash slot as the key).
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], '0')
  return 1
end
return 0
