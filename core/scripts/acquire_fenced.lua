-- SET NX PX, plus the fence counter, in one round trip.
-- KEYS[1] lock key, KEYS[2] fence counter (same hash slot); ARGV[1] token, ARGV[2] ttl ms,
-- ARGV[3] '1' to increment the counter here (one node: the increment is the order) or '0'
-- to only read it (N nodes: the client picks max + 1 and raises a quorum to it afterwards).
-- Returns the counter on a grant, -1 when the key is busy.
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  if ARGV[3] == '1' then
    return redis.call('INCR', KEYS[2])
  end
  return tonumber(redis.call('GET', KEYS[2]) or '0')
end
return -1
