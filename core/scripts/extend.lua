-- Compare-and-raise: renew our own grant's expiry to at least the ttl. Never deletes, and never
-- re-creates a key that has expired or now belongs to someone else (returns 0 for both; a key
-- of another type, a reentrant lock's hash, is someone else's: pcall turns WRONGTYPE into a
-- mismatch).
-- Never shortens, as no ferrolock script does: requests of one lock can run out of the order
-- they were sent in (a blocking caller's own connection beside the shared one, a reply that
-- timed out while its request was still on the way), and a late one with a shorter ttl would
-- otherwise cut a lease a later request set and its holder was told of. A raise commutes.
-- KEYS[1] lock key; ARGV[1] our token; ARGV[2] ttl in milliseconds.
if redis.pcall('GET', KEYS[1]) == ARGV[1] then
  local left = redis.call('PTTL', KEYS[1])
  if left >= 0 and left < tonumber(ARGV[2]) then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
  end
  return 1
end
return 0
