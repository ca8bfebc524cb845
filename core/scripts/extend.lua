-- Compare-and-pexpire: reset the ttl of our own grant. Never deletes, and never re-creates
-- a key that has expired or now belongs to someone else (returns 0 for both; a key of another
-- type, a reentrant lock's hash, is someone else's: pcall turns WRONGTYPE into a mismatch).
-- KEYS[1] lock key; ARGV[1] our token; ARGV[2] ttl in milliseconds.
if redis.pcall('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
