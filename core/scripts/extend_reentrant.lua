-- Redisson's renewal: compare-field-and-pexpire. Never re-creates an expired or foreign lock.
-- KEYS[1] lock key; ARGV[1] field; ARGV[2] ttl ms. Returns 1 when renewed, 0 otherwise.
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
