-- redlock_fence: record a Redlock hold's token on one master.
--
-- A Redlock hold's token is the largest of the tokens its majority of
-- masters gave (each acquire.lua's max(counter + 1, that master's clock)).
-- Masters' clocks differ, so the next holder, whose majority may hold other
-- masters, would not surely get more unless the token is written back: this
-- script raises the master's counter to it, so any later majority (which
-- shares a master with this one) starts above it.
--
-- KEYS[1]  the lock hash
-- KEYS[2]  the fence counter
-- ARGV[1]  holder id
-- ARGV[2]  the hold's token (the majority's largest)
-- ARGV[3]  window in milliseconds (the counter's TTL, as in acquire.lua)
--
-- The hold's token field is set to the token even where the master's own
-- token was larger (it answered after the majority had decided): every
-- master then records the hold's one token, as `inspect` reports it. That
-- field is 'fence' for a write hold, and the reader's own 'f:<holder id>'
-- for a read hold (read.lua's layout; 'fence' is a writer's field only).
--
-- returns  1  the master still records the hold (its token field is now the token)
--          0  it does not (the counter was raised all the same)
local token = tonumber(ARGV[2])
local counter = tonumber(redis.call('get', KEYS[2]) or '0')
if counter < token then
  redis.call('set', KEYS[2], ARGV[2], 'px', ARGV[3])
end
if redis.call('hexists', KEYS[1], ARGV[1]) == 1 then
  -- (HGET, not HMGET: the commands an ACL user needs stay those the README
  -- lists.)
  if redis.call('hget', KEYS[1], 'mode') == 'r' then
    redis.call('hset', KEYS[1], 'f:' .. ARGV[1], ARGV[2])
  else
    redis.call('hset', KEYS[1], 'fence', ARGV[2])
  end
  return 1
end
return 0
