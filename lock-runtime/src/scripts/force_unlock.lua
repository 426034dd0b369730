-- force_unlock: delete a lock whoever holds it, and wake its waiters.
--
-- KEYS[1]  the lock hash
-- KEYS[2]  the fence counter (kept for the window only, as after a release)
-- ARGV[1]  release channel
-- ARGV[2]  window in milliseconds (see acquire.lua)
--
-- returns  1  a lock was deleted
--          0  there was no lock
if redis.call('del', KEYS[1]) == 1 then
  redis.call('pexpire', KEYS[2], ARGV[2])
  redis.call('publish', ARGV[1], '1')
  return 1
end
return 0
