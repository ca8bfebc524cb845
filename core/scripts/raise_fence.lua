-- Raises the fence counter to our grant's fence, only while the node still holds our token,
-- so the raise happens-before any later grant on this node. Never lowers it.
-- KEYS[1] lock key, KEYS[2] fence counter; ARGV[1] token, ARGV[2] fence.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  local current = tonumber(redis.call('GET', KEYS[2]) or '0')
  if current < tonumber(ARGV[2]) then
    redis.call('SET', KEYS[2], ARGV[2])
  end
  return 1
end
return 0
