-- force_unlock: delete a lock whoever holds it, and wake its waiters.
--
-- KEYS[1]  the lock hash
-- ARGV[1]  release channel
--
-- returns  1  a lock was deleted
--          0  there was no lock
if redis.call('del', KEYS[1]) == 1 then
  redis.call('publish', ARGV[1], '1')
  return 1
end
return 0
