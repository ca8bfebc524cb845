-- Raises the fence counter to our grant's fence, only while the node still holds our grant,
-- so the raise happens-before any later grant on this node. Never lowers it.
-- KEYS[1] lock key, KEYS[2] fence counter; ARGV[1] token (plain) or field (reentrant),
-- ARGV[2] fence, ARGV[3] '1' for a reentrant (hash) lock.
-- A key of the other type is someone else's grant (pcall turns WRONGTYPE into "not ours").
local ours
if ARGV[3] == '1' then
  ours = redis.pcall('HEXISTS', KEYS[1], ARGV[1]) == 1
else
  ours = redis.pcall('GET', KEYS[1]) == ARGV[1]
end
if ours then
  local current = tonumber(redis.call('GET', KEYS[2]) or '0')
  if current < tonumber(ARGV[2]) then
    redis.call('SET', KEYS[2], ARGV[2])
  end
  return 1
end
return 0
