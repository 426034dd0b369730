-- release: give back one hold; free the lock and wake waiters when none is left.
--
-- KEYS[1]  the lock hash
-- ARGV[1]  holder id
-- ARGV[2]  release channel (PUBLISHed to when the lock becomes free)
--
-- returns  -1  not held: the lock is gone or belongs to someone else (nothing changed)
--           0  freed: the hash is deleted and one message went to the channel
--          >0  still held by us with this many holds left (TTL unchanged)
local holds = tonumber(redis.call('hget', KEYS[1], ARGV[1]))
if not holds then
  return -1
end
if holds > 1 then
  return redis.call('hincrby', KEYS[1], ARGV[1], -1)
end
redis.call('del', KEYS[1])
redis.call('publish', ARGV[2], '1')
return 0
