-- renew: extend the lease of a lock, only while it is still ours.
--
-- KEYS[1]  the lock hash
-- KEYS[2]  the fence counter (kept `window` past the new lease end)
-- ARGV[1]  holder id
-- ARGV[2]  lease in milliseconds
-- ARGV[3]  window in milliseconds (see acquire.lua)
--
-- returns  1  renewed
--          0  not ours any more (expired, deleted, taken over): the holder has lost it
if redis.call('hexists', KEYS[1], ARGV[1]) == 1 then
  redis.call('pexpire', KEYS[1], ARGV[2])
  redis.call('pexpire', KEYS[2], tonumber(ARGV[2]) + tonumber(ARGV[3]))
  return 1
end
return 0
