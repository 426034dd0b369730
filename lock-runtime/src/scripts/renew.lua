-- renew: extend the lease of a lock, only while it is still ours.
--
-- KEYS[1]  the lock hash
-- ARGV[1]  holder id
-- ARGV[2]  lease in milliseconds
--
-- returns  1  renewed
--          0  not ours any more (expired, deleted, taken over): the holder has lost it
if redis.call('hexists', KEYS[1], ARGV[1]) == 1 then
  redis.call('pexpire', KEYS[1], ARGV[2])
  return 1
end
return 0
