-- acquire: take the lock, or re-enter it, or report who is in the way.
--
-- KEYS[1]  the lock hash          (field = holder id, value = hold count)
-- KEYS[2]  the fence counter      (never expires; survives every release)
-- ARGV[1]  holder id              ("<process-uuid>:<n>", unique per hold)
-- ARGV[2]  lease in milliseconds
--
-- returns  {1, fence}  held: the lock is ours (first acquisition or re-entry)
--          {0, pttl}   busy: another holder has it for pttl more milliseconds
--
-- Fencing tokens: the counter is incremented on every first acquisition. When
-- it starts over (a new key, or Redis restarted without its data) it is moved
-- to the server time in microseconds, which is larger than any token handed
-- out before: tokens of one key are serialised by the lock itself, at least a
-- round trip apart, so a counter never runs ahead of the clock.
if redis.call('exists', KEYS[1]) == 0 then
  local fence = redis.call('incr', KEYS[2])
  if fence == 1 then
    local now = redis.call('time')
    fence = tonumber(now[1]) * 1000000 + tonumber(now[2])
    redis.call('set', KEYS[2], string.format('%.0f', fence))
  end
  redis.call('hset', KEYS[1], ARGV[1], 1)
  redis.call('pexpire', KEYS[1], ARGV[2])
  return {1, fence}
end
if redis.call('hexists', KEYS[1], ARGV[1]) == 1 then
  redis.call('hincrby', KEYS[1], ARGV[1], 1)
  redis.call('pexpire', KEYS[1], ARGV[2])
  return {1, tonumber(redis.call('get', KEYS[2]) or '0')}
end
return {0, redis.call('pttl', KEYS[1])}
